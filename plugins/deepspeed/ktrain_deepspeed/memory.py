"""What one rank holds under DeepSpeed ZeRO: the plugin's answer to ``ktrain_collect_memory``. No torch here.

ZeRO-1 and ZeRO-2 keep the whole model on every rank, flattened per parameter group (ktrain's two:
matrices, and norms and biases) into one buffer padded to a multiple of 2 x N elements; each rank's
optimizer steps its 1/N of each buffer as an fp32 master copy (a copy even when the weights are fp32)
with fp32 gradients and the optimizer's states. ZeRO-3 also divides the weights: each parameter's
partition is ceil(numel / N) elements. The buffers are the reduce bucket (``reduce_bucket_size``
elements, twice under ``overlap_comm``) and, under ZeRO-3, two gathered blocks. ``offload_optimizer``
moves the master copies, their gradients and the states to host memory, ``offload_param`` the ZeRO-3
partitions of the weights.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from ktrain.memory.parts import ModelStates, OptimizerModel, Weight
from ktrain_deepspeed import zero
from ktrain_deepspeed.links import get
from ktrain_deepspeed.source import SourceError, read


@attrs.frozen
class ZeroMemory:
    """The ``"sharding"`` model of ZeRO ``stage`` over ``ranks``; ``bf16`` casts the weights to bf16."""

    stage: int
    ranks: int
    bf16: bool
    bucket: int
    overlap: bool
    offload_optimizer: bool
    offload_params: bool

    @property
    def name(self) -> str:
        """How ``ktrain plan`` names it."""
        return f"ZeRO-{self.stage}" + (" (optimizer offloaded)" if self.offload_optimizer else "")

    @property
    def weight_bytes(self) -> int | None:
        """Under bf16 DeepSpeed computes with the bf16 copy of the weights."""
        return 2 if self.bf16 else None

    def _element(self, w: Weight) -> float:
        return 2 if self.bf16 and w.element_bytes == 4 else w.element_bytes

    def frozen_copy(self, weights: Sequence[Weight], rank: int) -> int:
        """What each rank holds of a frozen copy of ``weights`` (``ktrain_shard_frozen``): ZeRO-3 partitions every
        weight (in bf16 under bf16; DeepSpeed keeps weights below its persistence threshold whole, not counted,
        as for the trained weights); ZeRO-1/2 keep it whole."""
        if self.stage != 3:
            return sum(w.bytes for w in weights)
        return sum(math.ceil(math.ceil(w.numel / self.ranks) * self._element(w)) for w in weights)

    def states(self, weights: Sequence[Weight], optimizer: OptimizerModel, rank: int) -> ModelStates:
        """What each rank holds: weights (whole or partitioned), fp32 partitions, their gradients and states."""
        trained = [w for w in weights if w.trainable]
        frozen = sum(w.bytes for w in weights if not w.trainable)
        if self.stage == 3:
            shares = {id(w): math.ceil(w.numel / self.ranks) for w in trained}
            params = sum(math.ceil(shares[id(w)] * self._element(w)) for w in trained) + frozen
            share = sum(shares.values())
        else:
            groups = [g for g in ([w for w in trained if w.matrix], [w for w in trained if not w.matrix]) if g]
            align = 2 * self.ranks
            padded = [math.ceil(sum(w.numel for w in g) / align) * align for g in groups]
            params = sum(math.ceil(n * self._element(g[0])) for n, g in zip(padded, groups, strict=True)) + frozen
            share = sum(padded) // self.ranks
        master = 4 * share
        grads = 4 * share
        moments = optimizer.state_bytes(share, 4) - (4 * share if optimizer.master else 0)
        held = master + moments
        element = 2 if self.bf16 else 4
        buffers = self.bucket * element * (2 if self.overlap else 1)
        if self.stage == 3:
            blocks: dict[Any, int] = {}
            for w in weights:
                blocks[w.block] = blocks.get(w.block, 0) + math.ceil(w.numel * self._element(w))
            buffers += 2 * max((s for b, s in blocks.items() if b is not None), default=0)
        host: dict[str, int] = {}
        if self.offload_optimizer:
            host.update({"gradients": grads, "optimizer states": held})
            grads = held = 0
        if self.offload_params and self.stage == 3:
            host["parameters"] = params
            params = 0
        return ModelStates(parameters=params, gradients=grads, optimizer=held, buffers=buffers, host=host)


DEFAULT_BUCKET = 500_000_000
"""DeepSpeed's ``reduce_bucket_size`` when the JSON leaves it out; ``auto`` means hidden x hidden (Hugging Face's)."""


def _bucket(value: Any, hidden: int) -> int:
    if value is None:
        return DEFAULT_BUCKET
    return hidden * hidden if value == "auto" else int(value)


def collect_memory(config: Any, mesh: Any, model_shape: Any) -> dict[str, Any] | None:
    """The plugin's answer: the ``"sharding"`` model of the ZeRO stage the ``deepspeed`` JSON asks for."""
    if config.deepspeed is None:
        return None
    try:
        settings = read(config.deepspeed).settings
    except SourceError:
        return None  # the config's check reports it
    stage = zero.stage(settings)
    if stage not in (1, 2, 3):
        return None
    bf16 = get(settings, "bf16.enabled")
    return {
        "sharding": ZeroMemory(
            stage=stage,
            ranks=mesh.gradient_ranks,
            bf16=bool(config.bf16 or config.bfloat16) if bf16 in (None, "auto") else bool(bf16),
            bucket=_bucket(get(settings, "zero_optimization.reduce_bucket_size"), model_shape.hidden),
            overlap=bool(get(settings, "zero_optimization.overlap_comm")),
            offload_optimizer=zero.offloads_optimizer(settings),
            offload_params=zero.offloads_params(settings),
        )
    }
