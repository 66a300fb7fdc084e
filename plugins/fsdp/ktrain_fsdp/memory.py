"""What one rank holds under FSDP2 and FSDP1: the plugin's answer to ``ktrain_collect_memory``. No torch here.

FSDP2 shards every parameter along dim 0 over the ``dp_shard`` x ``cp`` ranks in chunks of
ceil(rows / N) rows (``torch.chunk``): a rank's parameter and gradient are stored padded to a whole
chunk, and the optimizer's states are made like the unpadded local shard (the last ranks may hold
fewer rows, or none). FSDP1 flattens each unit (a transformer block, and the root's rest) into one
buffer padded to a multiple of N and holds 1/N of it. The gathered weights of a unit (in the compute
dtype) and the reduce-scatter's input are buffers: two units at a time with prefetching, or every
block's weights from forward to backward when ``reshard_after_forward`` is off.
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

    def _fsdp2(self, weights: Sequence[Weight], optimizer: OptimizerModel, rank: int) -> tuple[int, int, int]:
        params = grads = states = 0
        for w in weights:
            rows, *rest = w.shape
            per_row = math.prod(rest) if rest else 1
            padded, held = chunk_rows(rows, self.ranks, rank)
            shard = math.ceil(padded * per_row * w.element_bytes) + w.extra_bytes
            params += shard
            if w.trainable:
                grads += shard
                states += optimizer.state_bytes(held * per_row, w.element_bytes)
        return params, grads, states

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
        largest = max((size for block, size in blocks.items() if block is not None), default=0)
        if not self.options.reshard_after_forward:
            return sum(size for block, size in blocks.items() if block is not None) + largest
        return 2 * largest + 2 * largest  # two units gathered, two reduce-scatter inputs

    def states(self, weights: Sequence[Weight], optimizer: OptimizerModel, rank: int) -> ModelStates:
        """What ``rank`` holds: its shards, their gradients and states, and the gather buffers."""
        if self.options.version == 2:
            params, grads, states = self._fsdp2(weights, optimizer, rank)
        else:
            params, grads, states = self._fsdp1(weights, optimizer)
        buffers = self._buffers(weights) if self.ranks > 1 or self.options.version == 2 else 0
        if self.options.offload_params:
            host = {"parameters": params, "gradients": grads, "optimizer states": states}
            return ModelStates(parameters=0, gradients=0, optimizer=0, buffers=buffers, host=host)
        return ModelStates(parameters=params, gradients=grads, optimizer=states, buffers=buffers)


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
