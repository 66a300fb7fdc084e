"""The kernel's own answers: its optimizers' states and its sharding (one process, or DDP replicas).

Used when no plugin answers ``"optimizer"`` or ``"sharding"`` in ``ktrain_collect_memory``.
"""

from __future__ import annotations

from collections.abc import Sequence

import attrs

from ktrain.memory.parts import ModelStates, OptimizerModel, Weight

KERNEL_OPTIMIZERS: dict[str, OptimizerModel] = {
    "adamw_torch": OptimizerModel("adamw_torch"),
    "adamw_torch_fused": OptimizerModel("adamw_torch_fused"),
    "adamw_fp32_master": OptimizerModel("adamw_fp32_master", moment_bytes=4, master=True),
    "sgd": OptimizerModel("sgd", moments=0),
}
"""The kernel's optimizers (``ktrain.builtin.optimizers``): AdamW keeps two moments in the weight's dtype;
``adamw_fp32_master`` keeps fp32 moments and an fp32 master of each bf16 weight; SGD without momentum none."""


def kernel_optimizer(name: str) -> OptimizerModel | None:
    """The kernel's model of the optimizer ``name``, or None when it is not one of the modelled ones."""
    return KERNEL_OPTIMIZERS.get(name)


def replicated(weights: Sequence[Weight], optimizer: OptimizerModel) -> ModelStates:
    """Every rank holds everything: parameters, a gradient per trained weight in its dtype, the states."""
    trained = [w for w in weights if w.trainable]
    return ModelStates(
        parameters=sum(w.bytes for w in weights),
        gradients=sum(w.bytes for w in trained),
        optimizer=sum(optimizer.state_bytes(w.numel, w.element_bytes) for w in trained),
    )


@attrs.frozen
class DataParallel:
    """The kernel's default sharding: one process, or DDP over ``replicas`` ranks, whose gradient buckets
    (``gradient_as_bucket_view`` off, DDP's default) hold a second copy of the trained weights' gradients."""

    replicas: int
    name: str = "DDP"
    weight_bytes: int | None = None

    def states(self, weights: Sequence[Weight], optimizer: OptimizerModel, rank: int) -> ModelStates:
        """What each rank holds: everything, and DDP's buckets when there are several replicas."""
        whole = replicated(weights, optimizer)
        buckets = whole.gradients if self.replicas > 1 else 0
        return attrs.evolve(whole, buffers=buckets)
