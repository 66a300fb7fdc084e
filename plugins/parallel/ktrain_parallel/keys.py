"""The plugin's config keys: ``sequence_parallel_degree``, ``heads_k_stride`` and ``ring_attn_func``."""

from __future__ import annotations

from typing import Literal

import attrs

from ktrain.config.keys import key

ALL_GATHER_FUNCS = ("varlen_llama3", "batch_zigzag")
"""The values of ``ring_attn_func`` that ktrain's context parallelism implements (both all-gather K/V)."""


@attrs.define(kw_only=True)
class ParallelKeys:
    """Sequence parallelism and the context-parallel attention (tensor_parallel_size and
    context_parallel_size are the kernel's mesh keys)."""

    sequence_parallel_degree: int = key(
        1, "Ulysses sequence parallelism: ranks that split each sequence, exchanging heads by all-to-all"
    )
    heads_k_stride: int | None = key(
        None, "context parallelism: gather K/V this many KV heads at a time (default: all at once)"
    )
    ring_attn_func: Literal["varlen_llama3", "batch_ring", "batch_zigzag", "batch_stripe"] | None = key(
        None, "context-parallel attention: varlen_llama3 or batch_zigzag (both all-gather K/V, zigzag-balanced)"
    )
