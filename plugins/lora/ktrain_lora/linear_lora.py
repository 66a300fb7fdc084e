"""A LoRA layer over a ``torch.nn.Linear`` base as one autograd node, the sums in the products' epilogues.

peft's forward computes the base's product, the adapter's two products, a scale and a sum over
``[tokens, out_features]``; autograd adds the input's two gradients (the base's and the adapter's) in a pass of
its own over ``[tokens, in_features]``, and the layer is half a dozen autograd nodes, each some Python on the
host. ``linear_lora`` is one node: ``addmm(x W^T + bias, x A^T, B^T, alpha=s)`` forward, and a backward that
computes ``g W`` and adds the adapter's ``(g B s) A`` into it in place (``addmm_``). It keeps what the products
would (``x``, ``x A^T`` and the weights); the scale meets only ``[tokens, r]`` and ``[out_features, r]`` tensors.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import DTensor


class _LinearLora(torch.autograd.Function):
    """``x W^T + bias + s (x A^T) B^T`` with a frozen ``W`` and ``bias``."""

    @staticmethod
    def forward(
        ctx: Any,
        x: torch.Tensor,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        lora_a: torch.Tensor,
        lora_b: torch.Tensor,
        scaling: float,
    ) -> torch.Tensor:
        dtype = x.dtype
        weight, a, b = weight.to(dtype), lora_a.to(dtype), lora_b.to(dtype)
        rows = x.reshape(-1, x.shape[-1])
        out = x.new_empty(*x.shape[:-1], weight.shape[0])  # written through a view, returned whole (not a view)
        if bias is None:
            torch.mm(rows, weight.t(), out=out.view(rows.shape[0], -1))
        else:
            torch.addmm(bias.to(dtype), rows, weight.t(), out=out.view(rows.shape[0], -1))
        low = rows @ a.t()
        out.view(rows.shape[0], -1).addmm_(low, b.t(), alpha=scaling)
        ctx.save_for_backward(x, weight, a, b, low)
        ctx.scaling, ctx.dtypes = scaling, (lora_a.dtype, lora_b.dtype)
        return out

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x, weight, a, b, low = ctx.saved_tensors
        rows, grad = x.reshape(-1, x.shape[-1]), grad.reshape(-1, grad.shape[-1])
        grad_low = (grad @ b).mul_(ctx.scaling)
        grad_a = (grad_low.t() @ rows).to(ctx.dtypes[0]) if ctx.needs_input_grad[3] else None
        grad_b = (grad.t() @ low).mul_(ctx.scaling).to(ctx.dtypes[1]) if ctx.needs_input_grad[4] else None
        grad_x = (grad @ weight).addmm_(grad_low, a).view(x.shape) if ctx.needs_input_grad[0] else None
        return grad_x, None, None, grad_a, grad_b, None


def linear_lora(
    base: torch.nn.Module, x: torch.Tensor, lora_a: torch.Tensor, lora_b: torch.Tensor, scaling: float
) -> torch.Tensor | None:
    """``base(x) + scaling (x A^T) B^T`` for a plain, frozen ``torch.nn.Linear`` ``base``, in autocast's dtype
    (without autocast, the input's); None where ``base`` is anything else (a subclass, a trained weight or bias,
    hooks, a sharded weight): then the caller composes the modules."""
    weight, bias = base.weight, base.bias
    if type(base) is not torch.nn.Linear or base._forward_hooks or base._forward_pre_hooks:
        return None
    if weight.requires_grad or (bias is not None and bias.requires_grad):
        return None
    if isinstance(weight, DTensor) or hasattr(weight, "ds_id"):
        return None
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else x.dtype
    if not torch.is_autocast_enabled(device) and weight.dtype != dtype:
        return None
    return _LinearLora.apply(x.to(dtype), weight, bias, lora_a, lora_b, scaling)
