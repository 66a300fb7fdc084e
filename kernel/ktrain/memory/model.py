"""One rank's peak memory for a checked run plan: the kernel's arithmetic plus the plugins' answers.

The plugins answer ``ktrain_collect_memory(config, mesh, model_shape)`` (vocabulary in
``ktrain.memory.parts``); the kernel applies them in a fixed order: the weights (adapters, quantized
bases), tensor parallelism, the optimizer, the sharding, then the activations. An active plugin that
claims a role and gives no answer is listed as not modelled: its effect on memory is missing.

The peak is the largest of three moments of a step after the first, each over the parameters and the
optimizer's states: the loss's backward (the sharding's buffers, every saved activation and the logits'
12 bytes each), the first checkpointed block rebuilt (the buffers, the saved activations and that block),
and the end of backward (the gradients and what the sharding holds then: its buffers, or FSDP2's last
reduce-scatter). Under gradient accumulation the gradients of earlier
micro-batches are held at all three. Under autocast a frozen linear weight of a wider dtype (an adapter's
fp32 base) is cast in every forward, and its cast is kept for the backward: counted with the activations.
"""

from __future__ import annotations

from typing import Any

import attrs

from ktrain.config.mesh import MeshPlan
from ktrain.memory.activations import Activations, activations, block_bytes, logits_bytes
from ktrain.memory.defaults import DataParallel, kernel_optimizer
from ktrain.memory.parts import Checkpointing, ModelStates, OptimizerModel, PairsModel, ParallelModel, Weight
from ktrain.memory.shape import ModelShape, read_shape

ALLOCATOR_OVERHEAD = 0.05
"""Share of the allocated peak the caching allocator holds beyond it (fragmentation), for fitting."""
CONTEXT_BYTES = 1 << 30
"""A CUDA context and its libraries' workspaces, outside the allocator: about 1 GiB on an H200."""
SKIPPED_ROLES = frozenset({"checkpoint_format", "export", "lr_scheduler"})
"""Roles that do not change a step's memory: their owners need not answer."""


@attrs.frozen
class Prediction:
    """One rank's predicted peak, by component (bytes), and what the model leaves out; ``trained`` counts the
    trained parameters of the whole model, ``checkpointing`` says which blocks are recomputed."""

    states: ModelStates
    activations: Activations
    logits: int
    accumulation: bool
    sharding: str
    optimizer: str
    trained: int = 0
    checkpointing: Checkpointing | None = None
    not_modelled: tuple[str, ...] = ()

    @property
    def peak(self) -> int:
        """Bytes allocated at the step's peak."""
        s = self.states
        base = s.parameters + s.optimizer + (s.gradients if self.accumulation else 0)
        a = self.activations
        moments = (
            s.buffers + a.saved + self.logits,
            s.buffers + a.saved + a.rebuilt,
            s.end_of_backward + (0 if self.accumulation else s.gradients),
        )
        return base + max(moments)

    @property
    def device_bytes(self) -> int:
        """What the device must have free: the peak, the allocator's overhead and a CUDA context."""
        return round(self.peak * (1 + ALLOCATOR_OVERHEAD)) + CONTEXT_BYTES

    def components(self) -> list[tuple[str, int]]:
        """(name, bytes) of each component, in the order ``ktrain plan`` prints them."""
        s = self.states
        return [
            ("parameters", s.parameters),
            ("gradients", s.gradients),
            ("optimizer states", s.optimizer),
            ("communication buffers", s.buffers),
            ("last gradient reduce", s.last_reduce or 0),
            ("activations", self.activations.saved),
            ("recomputed block", self.activations.rebuilt),
            ("logits", self.logits),
        ]


def base_weights(shape: ModelShape, config: Any) -> list[Weight]:
    """The model's tensors as the kernel loads them: fp32, or bf16 under ``bfloat16: true``; all trained."""
    element = 2 if config.bfloat16 else 4
    return [Weight(t.name, t.shape, t.kind, t.block, element) for t in shape.tensors()]


def compute_bytes(config: Any) -> int:
    """Bytes of an activation: 2 under bf16/fp16 compute, 4 otherwise."""
    return 2 if (config.bf16 or config.bfloat16 or config.fp16) else 4


def frozen_casts(weights: list[Weight], compute: int) -> int:
    """Bytes of the frozen linear weights' casts to the compute dtype that autocast makes in forward and the
    products keep for backward (an adapter's fp32 base under bf16 autocast); packed weights dequantize instead."""
    frozen = (w for w in weights if w.kind == "linear" and not w.trainable and w.element_bytes > compute)
    return sum(w.numel * compute for w in frozen)


def kernel_checkpointing(config: Any) -> Checkpointing | None:
    """The kernel's ``gradient_checkpointing``: the share ``gradient_checkpointing_fraction`` of the blocks
    recomputed (every block where it is ``auto``, as a run off a GPU takes it), or none."""
    if not config.gradient_checkpointing:
        return None
    fraction = config.gradient_checkpointing_fraction
    return Checkpointing(1.0 if fraction == "auto" else float(fraction))


def predict(config: Any, mesh: MeshPlan, plugins: Any, shape: ModelShape | None = None, rank: int = 0) -> Prediction:
    """Rank ``rank``'s peak for ``config`` on ``mesh`` with the run's active ``plugins``.

    Raises ``ShapeError`` when the model's config.json cannot be read.
    """
    shape = shape or read_shape(config)
    answers = plugins.collect_mapping("ktrain_collect_memory", "memory part", config=config, mesh=mesh,
                                      model_shape=shape)  # fmt: skip
    given = {name: value for name, (value, _) in answers.items()}
    answered = {info.name for _, info in answers.values()}
    missing = sorted(
        {
            act.plugin.describe()
            for act in plugins.activations
            if not act.default and set(act.roles) - SKIPPED_ROLES and act.plugin.name not in answered
        }
    )
    loaded = weights = base_weights(shape, config)
    if "weights" in given:
        weights = given["weights"](weights)
    parallel: ParallelModel = given.get("parallel") or ParallelModel()
    weights = parallel.split(weights)
    optimizer: OptimizerModel | None = given.get("optimizer") or kernel_optimizer(config.optimizer)
    if optimizer is None:
        missing.append(f"the optimizer '{config.optimizer}' (counted as AdamW)")
        optimizer = OptimizerModel(config.optimizer)
    sharding = given.get("sharding") or DataParallel(mesh.gradient_ranks)
    states = sharding.states(weights, optimizer, rank)
    pairs: PairsModel | None = given.get("pairs")
    if pairs and pairs.reference_copy:  # a frozen copy of the model as loaded: what this rank holds of it
        copy = parallel.split(loaded)
        held = getattr(sharding, "frozen_copy", None)
        reference = held(copy, rank) if held is not None else sum(w.bytes for w in copy)
        states = attrs.evolve(states, parameters=states.parameters + reference)
    tokens = config.micro_batch_size * config.sequence_len * (pairs.rows if pairs else 1) // parallel.cp
    element = getattr(sharding, "weight_bytes", None) or next(w.element_bytes for w in weights if w.kind == "embedding")
    checkpointing = given.get("checkpointing", kernel_checkpointing(config))
    kernels = frozenset().union(*(given.get(name, ()) for name in ("kernels", "compiled", "float8")))
    held = activations(shape, tokens, int(element), compute_bytes(config), checkpointing, parallel.tp, kernels)
    if not getattr(sharding, "weight_bytes", None):
        held = attrs.evolve(held, saved=held.saved + frozen_casts(weights, compute_bytes(config)))
    logits = logits_bytes(shape, tokens, given.get("loss"))
    if pairs:  # log-probabilities a chunk of logits at a time
        logits = min(pairs.loss_bytes, logits)
    return Prediction(
        states=states,
        activations=held,
        logits=logits,
        accumulation=config.gradient_accumulation_steps > 1,
        sharding=sharding.name,
        optimizer=optimizer.name,
        trained=sum(w.numel for w in weights if w.trainable) * parallel.tp,
        checkpointing=checkpointing,
        not_modelled=tuple(missing),
    )


__all__ = ["Prediction", "block_bytes", "predict"]
