"""NVFP4 fake quantization that runs on any device: torchao's NVFP4 round trip in the forward, the matmul in
the layer's own precision.

torchao's ``NVFP4FakeQuantizedLinear`` multiplies in FP4 (a Blackwell GPU's scaled matmul); here the weight
and the input are rounded as ``NVFP4Tensor.to_nvfp4`` rounds them (blocks of 16 along the last dimension,
each with a float8 e4m3 scale, under one fp32 scale per tensor from its absolute maximum, as torchao's nvfp4
recipe sets it) and dequantized back, and ``F.linear`` multiplies the rounded values. The backward passes the
gradient through the rounding unchanged (straight-through), as torchao's fake quantizers do.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale

BLOCK = 16
"""Elements per NVFP4 block (one e4m3 scale each)."""


def nvfp4_round_trip(x: torch.Tensor) -> torch.Tensor:
    """``x`` quantized to NVFP4 with a per-tensor scale and dequantized to its own dtype (last dimension a
    multiple of 16; float32 or bfloat16)."""
    flat = x.reshape(-1, x.shape[-1]).contiguous()
    scale = per_tensor_amax_to_scale(flat.abs().max())
    return NVFP4Tensor.to_nvfp4(flat, block_size=BLOCK, per_tensor_scale=scale).dequantize(x.dtype).view(x.shape)


class _StraightThrough(torch.autograd.Function):
    """NVFP4 rounding in the forward, the identity in the backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        return nvfp4_round_trip(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad


class NVFP4FakeQuantizer(torch.nn.Module):
    """Rounds a tensor to NVFP4 and back while ``enabled``; holds no state (nothing in the state dict)."""

    def __init__(self) -> None:
        super().__init__()
        self.enabled = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` rounded (straight-through) when enabled, else ``x``."""
        return _StraightThrough.apply(x) if self.enabled else x


class NVFP4Linear(torch.nn.Linear):
    """A linear layer whose weight (and, with ``activations``, input) is rounded to NVFP4 in the forward.

    It keeps the parameters of the layer it replaces, so the state dict has the plain model's names.
    """

    def __init__(self, linear: torch.nn.Linear, activations: bool) -> None:
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        self.weight_fake_quantizer = NVFP4FakeQuantizer()
        self.activation_fake_quantizer = NVFP4FakeQuantizer() if activations else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear`` of the rounded input and weight, in their own precision."""
        if self.activation_fake_quantizer is not None:
            x = self.activation_fake_quantizer(x)
        return F.linear(x, self.weight_fake_quantizer(self.weight), self.bias)


def swap_linears(model: torch.nn.Module, activations: bool) -> None:
    """Replace each ``nn.Linear`` of ``model`` whose input size is a multiple of 16 by an ``NVFP4Linear``, in
    place (the rounding's blocks of 16 run along the input dimension)."""
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if type(child) is torch.nn.Linear and child.in_features % BLOCK == 0:
                setattr(parent, name, NVFP4Linear(child, activations))
