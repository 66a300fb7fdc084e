"""What one rank holds under FSDP2 and FSDP1: the plugin's answer to ``ktrain_collect_memory``. No torch here.

FSDP2 shards every parameter along dim 0 over the ``dp_shard`` x ``cp`` ranks in chunks of
ceil(rows / N) rows (``torch.chunk``): a rank's parameter and gradient are stored padded to a whole
chunk, and the optimizer's states are made like the unpadded local shard (the last ranks may hold
fewer rows, or none). FSDP1 flattens each unit (a transformer block, and the root's rest) into one
buffer padded to a multiple of N and holds 1/N of it. The gathered weights of a unit (in the compute
dtype) and the reduce-scatter's input are buffers: two units at a time with prefetching, or every
block's weights from forward to backward when ``reshard_after_forward`` is off, and the root unit's (the
embedding, the final norm and the output layer), gathered for the forward and again for the whole backward.
At the end of backward FSDP2 reduces the root unit's gradients (the largest unit of a Llama: both vocabulary
matrices): with its weights freed, it copies their unsharded gradients (compute dtype) into one fp32
reduce-scatter input of every rank's padded chunk, and casts the fp32 output (this rank's chunk) to the
weights' dtype when they are bf16: a last moment beside the gradients that outgrows the buffers (2 GiB
under fp32 weights, 4 GiB under bf16 weights, for the 1.5B Llama shape in configs/bench on one rank: the
peaks measured on one H200 agree, docs/performance.md).
``offload_params`` moves the shards, their gradients and the optimizer's states to host memory. A
quantized weight's state (``extra_bytes``: a 4-bit weight's scales and code tables) is no parameter: every
rank holds all of it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import attrs

from ktrain.config.report import Report
from ktrain.memory.parts import Checkpointing, ModelStates, OptimizerModel, Weight
from ktrain_fsdp.options import FsdpOptions, enabled, resolve

REDUCE_BYTES = 4
"""Bytes an element of FSDP's gradient reductions: fp32 (``ktrain_fsdp.fsdp2.mixed_precision``)."""


def chunk_rows(rows: int, ranks: int, rank: int) -> tuple[int, int]:
    """(padded rows, held rows) of ``rank``'s dim-0 chunk of a tensor of ``rows`` rows over ``ranks``."""
    chunk = math.ceil(rows / ranks)
    return chunk, max(0, min(chunk, rows - rank * chunk))


@attrs.frozen
class FsdpMemory:
    """The ``"sharding"`` model of FSDP: ``ranks`` shard the weights; ``compute_bytes`` is the gathered dtype."""

    options: FsdpOptions
    ranks: int
    compute_bytes: int

    @property
    def name(self) -> str:
        """How ``ktrain plan`` names it."""
        return f"FSDP{self.options.version}"

    @property
    def weight_bytes(self) -> int:
        """FSDP computes with weights gathered in the compute dtype."""
        return self.compute_bytes

    def _shard(self, w: Weight, rank: int) -> tuple[int, int]:
        """FSDP2's shard of ``w`` on ``rank``: its bytes (padded rows) and the elements it holds."""
        rows, *rest = w.shape
        per_row = math.prod(rest) if rest else 1
        padded, held = chunk_rows(rows, self.ranks, rank)
        return math.ceil(padded * per_row * w.element_bytes) + w.extra_bytes, held * per_row

    def _fsdp2(self, weights: Sequence[Weight], optimizer: OptimizerModel, rank: int) -> tuple[int, int, int]:
        params = grads = states = 0
        for w in weights:
            shard, held = self._shard(w, rank)
            params += shard
            if w.trainable:
                grads += shard
                states += optimizer.state_bytes(held, w.element_bytes)
        return params, grads, states

    def frozen_copy(self, weights: Sequence[Weight], rank: int) -> int:
        """What ``rank`` holds of a frozen copy of ``weights`` (``ktrain_shard_frozen``): FSDP2 shards it as it
        shards the weights; FSDP1 keeps it whole."""
        if self.options.version != 2:
            return sum(w.bytes for w in weights)
        return sum(self._shard(w, rank)[0] for w in weights)

    def _fsdp1(self, weights: Sequence[Weight], optimizer: OptimizerModel) -> tuple[int, int, int]:
        params = grads = states = 0
        units: dict[Any, list[Weight]] = {}
        for w in weights:
            units.setdefault(w.block, []).append(w)
        for unit in units.values():
            for part in ([w for w in unit if w.trainable], [w for w in unit if not w.trainable]):
                numel = sum(w.numel for w in part)
                if not numel:
                    continue
                element = part[0].element_bytes
                share = math.ceil(numel / self.ranks)
                params += math.ceil(share * element) + sum(w.extra_bytes for w in part)
                if part[0].trainable:
                    grads += math.ceil(share * element)
                    states += optimizer.state_bytes(share, element)
        return params, grads, states

    def _buffers(self, weights: Sequence[Weight]) -> int:
        blocks: dict[Any, int] = {}
        for w in weights:
            gathered = w.numel * self.compute_bytes if w.element_bytes >= 2 else w.bytes
            blocks[w.block] = blocks.get(w.block, 0) + gathered
        root = blocks.pop(None, 0)
        largest = max(blocks.values(), default=0)
        if not self.options.reshard_after_forward:
            return root + sum(blocks.values()) + largest
        return root + 2 * largest + 2 * largest  # the root, two units gathered, two reduce-scatter inputs

    def _last_reduce(self, weights: Sequence[Weight], rank: int) -> int:
        """FSDP2's reduce-scatter of the root unit's gradients at the end of backward, beyond the gradients: the
        larger of the copy into its input (the unsharded gradients and the input; this rank's gradient not yet
        made) and the cast of its output (the input and the fp32 output, cast to the weights' bf16)."""
        unsharded = reduced = sharded = cast = 0
        for w in weights:
            if w.block is not None or not w.trainable:
                continue
            rows, *rest = w.shape
            per_row = math.prod(rest) if rest else 1
            padded, _ = chunk_rows(rows, self.ranks, rank)
            unsharded += w.numel * self.compute_bytes
            reduced += padded * self.ranks * per_row * REDUCE_BYTES
            sharded += math.ceil(padded * per_row * w.element_bytes)
            cast += padded * per_row * REDUCE_BYTES if w.element_bytes != REDUCE_BYTES else 0
        return max(unsharded + reduced - sharded, reduced + cast)

    def states(self, weights: Sequence[Weight], optimizer: OptimizerModel, rank: int) -> ModelStates:
        """What ``rank`` holds: its shards, their gradients and states, and the gather buffers."""
        if self.options.version == 2:
            params, grads, states = self._fsdp2(weights, optimizer, rank)
        else:
            params, grads, states = self._fsdp1(weights, optimizer)
        buffers = self._buffers(weights) if self.ranks > 1 or self.options.version == 2 else 0
        last = self._last_reduce(weights, rank) if self.options.version == 2 else None
        if self.options.offload_params:
            host = {"parameters": params, "gradients": grads, "optimizer states": states}
            return ModelStates(parameters=0, gradients=0, optimizer=0, buffers=buffers, host=host, last_reduce=last)
        return ModelStates(parameters=params, gradients=grads, optimizer=states, buffers=buffers, last_reduce=last)


def collect_memory(config: Any, mesh: Any) -> dict[str, Any] | None:
    """The plugin's answer: the ``"sharding"`` model, and ``"checkpointing"`` when FSDP recomputes blocks."""
    if not enabled(config):
        return None
    options = resolve(config, Report())
    compute = 2 if (config.bf16 or config.bfloat16 or config.fp16) else 4
    answer: dict[str, Any] = {"sharding": FsdpMemory(options, mesh.dims["dp_shard"] * mesh.dims["cp"], compute)}
    if options.activation_checkpointing:
        answer["checkpointing"] = Checkpointing(
            options.activation_checkpointing_fraction, options.activation_checkpointing_scope
        )
    return answer
