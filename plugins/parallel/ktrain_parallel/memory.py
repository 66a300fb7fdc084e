"""Tensor, context and sequence parallelism in one rank's memory: the plugin's answer to ``ktrain_collect_memory``.

Tensor-parallel ranks hold 1/tp of each block's projections, of the embedding and of the output layer
(Megatron's layout, ``ktrain_parallel.plans``) and of the activations inside attention and the MLP; the
activations between blocks are sequence shards. The logits are gathered whole on every rank.
Context-parallel (and Ulysses sequence-parallel) ranks each hold 1/cp of every row's tokens. No torch here.
"""

from __future__ import annotations

from typing import Any

from ktrain.memory.parts import ParallelModel


def collect_memory(mesh: Any) -> dict[str, Any] | None:
    """The ``"parallel"`` model when the mesh has tensor- or context-parallel ranks."""
    tp, cp = mesh.dims["tp"], mesh.dims["cp"]
    if tp == 1 and cp == 1:
        return None
    return {"parallel": ParallelModel(tp=tp, cp=cp)}
