"""FlashAttention-4's forward and backward as the CUDA kernels of SDPA's flash operators.

PyTorch's ``scaled_dot_product_attention`` runs attention without a mask through the ATen operators
``_scaled_dot_product_flash_attention`` and its backward when it picks its flash backend. ``register()``
gives those operators, on CUDA, implementations that call FlashAttention-4 (``flash_attn.cute``): the
same inputs, ``[batch, heads, length, dim]`` views of query, key and value (grouped keys and values with
fewer heads), the same outputs, the attention in the query's memory layout and the fp32 log-sum-exp of each
row. Every caller of SDPA's flash backend runs them: eager code, compiled graphs (inductor calls the
operators), DTensor's sharding rules. The operators' shape functions stay PyTorch's.

FlashAttention-4 has no dropout: a call with a dropout probability raises.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.library import Library

FORWARD = "_scaled_dot_product_flash_attention"
BACKWARD = "_scaled_dot_product_flash_attention_backward"


def _module() -> Any:
    from flash_attn.cute import interface

    return interface


def _no_dropout(dropout_p: float) -> None:
    if dropout_p != 0.0:
        raise RuntimeError(
            f"flash_attention_4: FlashAttention-4 has no dropout (attention dropout {dropout_p}); set "
            "flash_attention_4: false for a model whose attention drops out"
        )


def forward(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    dropout_p: float = 0.0,
    is_causal: bool = False,
    return_debug_mask: bool = False,
    *,
    scale: float | None = None,
) -> tuple:
    """``_scaled_dot_product_flash_attention`` on CUDA: the attention, written in ``query``'s layout."""
    _no_dropout(dropout_p)
    out = torch.empty_like(query)
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    result = _module()._flash_attn_fwd(
        q, k, v, softmax_scale=scale, causal=is_causal, return_lse=True, out=out.transpose(1, 2)
    )
    lse = result[1].contiguous()
    seed = torch.zeros((2,), dtype=torch.uint64, device=query.device)
    offset = torch.zeros((), dtype=torch.uint64, device=query.device)
    debug = torch.empty(0, dtype=query.dtype, device=query.device)
    return out, lse, None, None, query.shape[2], key.shape[2], seed, offset, debug


def backward(
    grad_out: torch.Tensor,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    out: torch.Tensor,
    logsumexp: torch.Tensor,
    cum_seq_q: torch.Tensor | None,
    cum_seq_k: torch.Tensor | None,
    max_q: int,
    max_k: int,
    dropout_p: float,
    is_causal: bool,
    philox_seed: torch.Tensor,
    philox_offset: torch.Tensor,
    *,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_scaled_dot_product_flash_attention_backward`` on CUDA: the gradients of query, key and value, each in
    its input's layout."""
    _no_dropout(dropout_p)
    grads = tuple(torch.empty_like(t) for t in (query, key, value))
    q, k, v, o, g, dq, dk, dv = (t.transpose(1, 2) for t in (query, key, value, out, grad_out, *grads))
    _module()._flash_attn_bwd(
        q, k, v, o, g, logsumexp.contiguous(), softmax_scale=scale, causal=is_causal, dq=dq, dk=dk, dv=dv,
        deterministic=torch.are_deterministic_algorithms_enabled(),
    )  # fmt: skip
    return grads


def register() -> Library:
    """Give SDPA's flash operators FlashAttention-4's kernels on CUDA, for as long as the returned library lives;
    imports flash-attn-4 first, so that a missing package fails here, not in the first forward."""
    _module()
    library = Library("aten", "IMPL", "CUDA")  # ATen operators given other kernels
    library.impl(FORWARD, forward, "CUDA")
    library.impl(BACKWARD, backward, "CUDA")
    return library
