"""The attention function of a split sequence, registered with transformers' ``AttentionInterface``.

Two ways over the ``cp`` ranks, chosen by the config:

- **context parallelism** (``context_parallel_size``): each rank keeps its queries and all-gathers
  the keys and values of the whole sequence (Llama 3's all-gather context parallelism; ring-flash-attn's
  ``varlen_llama3``), optionally ``heads_k_stride`` KV heads at a time. Any head count works; the
  gathered K/V are small under grouped-query attention.
- **Ulysses** (``sequence_parallel_degree``): an all-to-all turns the sequence shard of every head into
  the whole sequence of a head shard, attention runs as on one device, and a second all-to-all turns
  it back. Heads must divide over the ranks; K/V heads that do not are repeated first.

Either way the local computation is PyTorch SDPA with a causal, document-aware mask (SDPA's own causal
path where the mask is plain causal): flash-attn's variable-length kernels are not used under a split
sequence. With one rank (tensor parallelism alone) it is SDPA with the document mask of packed rows.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from ktrain_parallel.collectives import gather_sequence, heads_to_seq, seq_to_heads
from ktrain_parallel.sequence import Split

NAME = "ktrain_split_sequence"


@attrs.define
class SplitState:
    """What the attention of the current micro-batch needs: set by the train step, read by every layer
    (and by activation checkpointing's recomputation, so it is kept until the next micro-batch)."""

    mode: str  # "gather" or "ulysses"
    group: Any
    ranks: int
    heads_k_stride: int | None
    split: Split | None = None


STATE = SplitState(mode="gather", group=None, ranks=1, heads_k_stride=None)


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Any, dropout: float, scale: Any) -> torch.Tensor:
    return F.scaled_dot_product_attention(
        q,
        k,
        v,
        attn_mask=mask,
        dropout_p=dropout,
        is_causal=mask is None,
        scale=scale,
        enable_gqa=q.shape[1] != k.shape[1],
    )


def _local_queries(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, scale: Any) -> torch.Tensor:
    """This rank's queries (its runs of the sequence) over the whole ``k``/``v`` in natural order: each
    run attends to the keys up to its end, causal aligned to the lower right. On a GPU, unpacked rows
    need no mask tensor (SDPA's lower-right causal bias); otherwise one additive mask per run is made
    once per micro-batch and shared by the layers."""
    split = STATE.split
    outs, at = [], 0
    for i, (start, end) in enumerate(split.runs):
        q_run = q[:, :, at : at + end - start]
        if split.packed or q.device.type != "cuda":
            mask = split.run_mask(i, q.dtype)
        else:
            mask = causal_lower_right(end - start, end)
        outs.append(_sdpa(q_run, k[:, :, :end], v[:, :, :end], mask, dropout, scale))
        at += end - start
    return torch.cat(outs, dim=2)


def _gathered(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, scale: Any) -> torch.Tensor:
    split = STATE.split
    heads, kv_heads = q.shape[1], k.shape[1]
    stride = min(STATE.heads_k_stride or kv_heads, kv_heads)
    per_kv = heads // kv_heads
    outs = []
    for first in range(0, kv_heads, stride):
        k_part, v_part = k[:, first : first + stride], v[:, first : first + stride]
        if STATE.ranks > 1:
            k_part = gather_sequence(k_part.contiguous(), STATE.group)[:, :, split.natural]
            v_part = gather_sequence(v_part.contiguous(), STATE.group)[:, :, split.natural]
        q_part = q[:, first * per_kv : (first + k_part.shape[1]) * per_kv]
        if STATE.ranks > 1:
            outs.append(_local_queries(q_part, k_part, v_part, dropout, scale))
        else:
            outs.append(_sdpa(q_part, k_part, v_part, split.mask(whole=True), dropout, scale))
    return torch.cat(outs, dim=1) if len(outs) > 1 else outs[0]


def _ulysses(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, dropout: float, scale: Any) -> torch.Tensor:
    split, group, ranks = STATE.split, STATE.group, STATE.ranks
    if k.shape[1] % ranks:  # too few K/V heads to share out: repeat them up to the query heads
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        v = v.repeat_interleave(q.shape[1] // v.shape[1], dim=1)
    q, k, v = (seq_to_heads(t.contiguous(), group)[:, :, split.natural] for t in (q, k, v))
    out = _sdpa(q, k, v, split.mask(whole=True), dropout, scale)
    return heads_to_seq(out[:, :, split.order].contiguous(), group)


def split_sequence_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: Any,
    scaling: float | None = None,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """transformers' attention signature: ``[b, heads, s, d]`` in, ``[b, s, heads, d]`` out.

    ``attention_mask`` is ignored: the mask comes from the split (positions and documents).
    """
    if STATE.split is None:
        raise RuntimeError("the split-sequence attention ran outside a ktrain train step")
    attend = _ulysses if STATE.mode == "ulysses" and STATE.ranks > 1 else _gathered
    out = attend(query, key, value, dropout, scaling)
    return out.transpose(1, 2).contiguous(), None


def no_mask(*args: Any, **kwargs: Any) -> None:
    """The model builds no mask of its own: the attention function makes it from the split."""
    return None


def install(model: torch.nn.Module) -> None:
    """Register the function with transformers and make ``model`` use it."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, split_sequence_attention)
    AttentionMaskInterface.register(NAME, no_mask)
    model.set_attn_implementation(NAME)
