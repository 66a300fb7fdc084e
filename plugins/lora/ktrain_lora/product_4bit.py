"""A 4-bit base layer's product with the adapter's update added in the matrix multiply's epilogue.

bitsandbytes' ``Linear4bit`` dequantizes its weight and multiplies, writing the base's output; peft (or
``fused_forward_4bit``'s plain order) then adds the adapter's update in a pass of its own over
``[tokens, out_features]``: the base's output written, read again with the update, and the sum written.
``product_4bit(base, x, update)`` dequantizes the weight as bitsandbytes does and multiplies into the
update in place (``addmm_``): the GEMM reads the update once and writes the sum, and the base's
output is never a tensor of its own. Like bitsandbytes' product it keeps no tensor for the backward (the
packed weight stays an attribute of the autograd context), so a block's recompute under activation
checkpointing still stops before it when it is the block's last. The backward dequantizes again and
multiplies the gradient by the weight, as bitsandbytes' does; the update's gradient is the output's.
"""

from __future__ import annotations

from typing import Any

import bitsandbytes.functional as bnb_functional
import torch
from torch.distributed.tensor import DTensor


class _Product4bit(torch.autograd.Function):
    """``update += x @ dequantize(weight).T``, in place, returning ``update``."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, update: torch.Tensor, weight: torch.Tensor, state: Any) -> torch.Tensor:
        ctx.weight, ctx.state = weight, state
        with torch.autocast(x.device.type, enabled=False):
            dense = bnb_functional.dequantize_4bit(weight, state).to(x.dtype)
            update.view(-1, update.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), dense.t())
        ctx.mark_dirty(update)
        return update

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_x = None
        if ctx.needs_input_grad[0]:
            with torch.autocast(grad.device.type, enabled=False):
                dense = bnb_functional.dequantize_4bit(ctx.weight, ctx.state).to(grad.dtype)
                grad_x = grad @ dense
        return grad_x, grad, None, None


def product_4bit(base: Any, x: torch.Tensor, update: torch.Tensor) -> torch.Tensor | None:
    """``base(x) + update`` for a bitsandbytes ``Linear4bit`` ``base``, the sum in the product's epilogue, in
    ``x``'s dtype; None where ``base`` is not the plain case this computes (a bias, a weight without its
    quantization state, as FSDP's gathered one, or sharded, or repacked by bitsandbytes for its CPU kernel; no
    compute dtype yet), and without autograd (generation: for a few rows bitsandbytes' own kernels read the
    packed weight instead of dequantizing it): then the caller adds the update to ``base(x)``."""
    if not torch.is_grad_enabled():
        return None
    state = getattr(base.weight, "quant_state", None)
    plain = state is not None and not getattr(state, "packing_format_for_cpu", False)
    if not plain or base.bias is not None or isinstance(base.weight, DTensor) or base.compute_dtype is None:
        return None
    out = _Product4bit.apply(x.to(base.compute_dtype), update.to(base.compute_dtype), base.weight, state)
    return out.to(x.dtype)
