"""A LoRA layer over a bitsandbytes 4-bit base as two autograd nodes, the sums in the products' epilogues.

peft's forward of a ``Linear4bit`` layer runs the base's 4-bit product (dequantize, multiply), the adapter's
two products, a scale and a sum over ``[tokens, out_features]``; its backward adds the input's two gradients,
the base's and the adapter's, in a pass of its own over ``[tokens, in_features]``, and the layer is half a
dozen autograd nodes, each some Python on the host. ``linear_lora_4bit`` makes it two nodes:

1. the update ``((x A^T) s) B^T``, keeping ``x`` and ``(x A^T) s`` as the adapter's products would. Its
   backward computes the input's whole gradient: the base's ``g W`` (the weight dequantized again, as
   bitsandbytes' backward does) with the adapter's ``(g B s) A`` added in place by ``addmm_``;
2. the base's product added into the update in place (``addmm_`` over the dequantized weight), so the base's
   output is never a tensor of its own. It keeps no tensor for the backward (the packed weight is an attribute
   of its context), so under activation checkpointing PyTorch's recompute of a block, which stops once the
   last saved tensor is back, never runs a block's last 4-bit product again (a Llama's ``down_proj``).

On a GPU an nf4 weight is dequantized by one kernel (``ktrain_lora.dequantize_triton``), bitsandbytes'
values in one launch where bitsandbytes makes three. Everything computes in the base's compute dtype; the
adapter's weights are cast to it and their gradients returned in their own dtype, as autocast's casts do.
"""

from __future__ import annotations

import contextlib
import importlib.util
from typing import Any

import bitsandbytes.functional as bnb_functional
import torch
from torch.distributed.tensor import DTensor

TRITON = importlib.util.find_spec("triton") is not None  # CUDA builds of torch bring it on Linux


def _dequantize(weight: Any, state: Any) -> torch.Tensor:
    """The 4-bit ``weight`` in its compute dtype, as bitsandbytes dequantizes it; on a GPU an nf4 weight in one
    Triton kernel (``ktrain_lora.dequantize_triton``) instead of bitsandbytes' three."""
    if TRITON and weight.is_cuda and state.quant_type == "nf4":
        from ktrain_lora.dequantize_triton import dequantize  # Triton, imported where a weight is on a GPU

        return dequantize(weight, state)
    return bnb_functional.dequantize_4bit(weight, state)


class _Update(torch.autograd.Function):
    """``((x A^T) s) B^T``; the backward's input gradient includes the 4-bit base's ``g W``."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float, weight: Any, state: Any
    ) -> torch.Tensor:
        a, b = lora_a.to(x.dtype), lora_b.to(x.dtype)
        low = torch.matmul(x, a.t()).mul_(scaling)
        ctx.save_for_backward(x, a, b, low)
        ctx.scaling, ctx.weight, ctx.state, ctx.dtypes = scaling, weight, state, (lora_a.dtype, lora_b.dtype)
        return torch.matmul(low, b.t())  # not a view: the base's product is added into it in place

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, a, b, low = ctx.saved_tensors
        rows, grad = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_low = (grad @ b).mul_(ctx.scaling)
        grad_a = (grad_low.t() @ rows).to(ctx.dtypes[0]) if ctx.needs_input_grad[1] else None
        grad_b = (grad.t() @ low.reshape(-1, low.shape[-1])).to(ctx.dtypes[1]) if ctx.needs_input_grad[2] else None
        grad_x = None
        if ctx.needs_input_grad[0]:
            dense = _dequantize(ctx.weight, ctx.state).to(grad.dtype)
            grad_x = (grad @ dense).addmm_(grad_low, a).view(x.shape)
        return grad_x, grad_a, grad_b, None, None, None


class _Base(torch.autograd.Function):
    """``update += x @ dequantize(W)^T`` in place; the input's gradient through ``W`` is ``_Update``'s."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, update: torch.Tensor, weight: Any, state: Any) -> torch.Tensor:
        dense = _dequantize(weight, state).to(x.dtype)
        update.view(-1, update.shape[-1]).addmm_(x.reshape(-1, x.shape[-1]), dense.t())
        ctx.mark_dirty(update)
        return update

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        return None, grad, None, None


def linear_lora_4bit(
    base: Any, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor | None:
    """``base(x) + ((x A^T) scaling) B^T`` for a bitsandbytes ``Linear4bit`` ``base``, in its compute dtype; None
    where ``base`` is not the plain case this computes: a bias, a weight without its quantization state (as
    FSDP's gathered one), sharded, or repacked by bitsandbytes for its CPU kernel, no compute dtype yet, and
    without autograd (generation: for a few rows bitsandbytes' own kernels read the packed weight instead of
    dequantizing it)."""
    if not torch.is_grad_enabled():
        return None
    state = getattr(base.weight, "quant_state", None)
    plain = state is not None and not getattr(state, "packing_format_for_cpu", False)
    if not plain or base.bias is not None or isinstance(base.weight, DTensor) or base.compute_dtype is None:
        return None
    dtype, device = base.compute_dtype, x.device.type
    x = x.to(dtype)
    other = torch.is_autocast_enabled(device) and torch.get_autocast_dtype(device) != dtype
    with torch.autocast(device, enabled=False) if other else contextlib.nullcontext():  # the base's dtype, as
        update = _Update.apply(x, lora_a, lora_b, scaling, base.weight, state)  # bitsandbytes' product computes
        return _Base.apply(x, update, base.weight, state)
