"""LoRA's update computed without passes of its own over the layer's output or input.

peft's forward of a LoRA ``Linear`` (and of a bitsandbytes ``Linear4bit``) computes the update
``lora_B(lora_A(x)) * scaling`` as a tensor of the layer's whole output, multiplies it by the scale and
adds it to the base's output: two passes over a ``[tokens, out_features]`` tensor, twice more in the
backward, where autograd also adds the input's two gradients (the base's and the adapter's) in a pass over
``[tokens, in_features]``; after an input cast to the adapter's fp32 dtype (undone by autocast) and, for 4-bit
layers, a copy of the base's output. Here the scale never meets a tensor of the output's size, and the sums
are matrix multiplies' epilogues:

- a ``Linear`` layer is one autograd node (``ktrain_lora.linear_lora``): ``addmm(base(x), lora_A(x), B^T,
  alpha=scaling)``, rounded once instead of three times; its backward adds the adapter's input gradient into
  the base's with ``addmm_``. A base other than a plain frozen ``Linear`` (an FP8 one, say) keeps its own
  forward, with the update still in the ``addmm``'s epilogue;
- a 4-bit ``Linear4bit`` layer (``ktrain_lora.lora_4bit``) computes the update first, scaled on its
  ``[tokens, r]`` side, and then the base's product into it in place, so the base's output is never a
  tensor of its own. The order matters under activation checkpointing: the 4-bit product keeps no tensor for
  its backward, so when the last layer of a recomputed block is 4-bit (a Llama's ``down_proj``), PyTorch's
  recompute stops once the adapter's tensors are back and never runs that layer's dequantization and
  product again.

The layer takes this path when one active adapter is in it, without dropout, DoRA or a bias on ``lora_B``,
adapters enabled and not merged, called with no other argument, and weights that are plain tensors
(not ZeRO-3 partitions or DTensors); in every other case peft's own forward runs, so ``disable_adapter()``,
merged weights, dropout and several adapters behave as peft defines them.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import torch
from torch.distributed.tensor import DTensor

from ktrain_lora.linear_lora import linear_lora


def _adapter(layer: Any, args: tuple, kwargs: dict) -> str | None:
    """The one active adapter the fused path can compute for this call, or None: peft's forward must run."""
    if args or kwargs or layer.disable_adapters or layer.merged:
        return None
    active = [name for name in layer.active_adapters if name in layer.lora_A]  # peft skips the others too
    if len(active) != 1 or active[0] in layer.lora_variant:
        return None
    name = active[0]
    if not isinstance(layer.lora_dropout[name], torch.nn.Identity) or layer.lora_B[name].bias is not None:
        return None
    if not isinstance(layer.scaling[name], (int, float)):
        return None
    for weight in (layer.lora_A[name].weight, layer.lora_B[name].weight):
        if hasattr(weight, "ds_id") or isinstance(weight, DTensor):
            return None
    return name


def _fused_adapter(layer: Any, x: torch.Tensor, args: tuple, kwargs: dict) -> str | None:
    """``_adapter``, and None also where ``x`` would be cast: then peft's forward must run."""
    name = _adapter(layer, args, kwargs)
    if name is None:
        return None
    # Under autocast lora_A casts x to the compute dtype itself (peft's cast to fp32 and back is exact);
    # without it, peft would cast x to the adapter's dtype and the result back: left to peft's forward.
    lora_a, lora_b = layer.lora_A[name], layer.lora_B[name]
    if torch.is_autocast_enabled(x.device.type) or x.dtype == lora_a.weight.dtype == lora_b.weight.dtype:
        return name
    return None


def fused_forward(layer: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The forward of a peft LoRA ``Linear`` layer with its update fused into ``addmm``."""
    name = _fused_adapter(layer, x, args, kwargs)
    if name is None:
        return type(layer).forward(layer, x, *args, **kwargs)
    lora_a, lora_b, scaling = layer.lora_A[name].weight, layer.lora_B[name].weight, layer.scaling[name]
    fused = linear_lora(layer.base_layer, x, lora_a, lora_b, scaling)
    if fused is not None:
        return fused
    result = layer.base_layer(x)
    low = layer.lora_A[name](x)
    fused = torch.addmm(result.reshape(-1, result.shape[-1]), low.reshape(-1, low.shape[-1]), lora_b.t(), alpha=scaling)
    return fused.view(result.shape).to(result.dtype)


def fused_forward_4bit(layer: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The forward of a peft LoRA ``Linear4bit`` layer: the update scaled on its low-rank side, the base's
    4-bit product last."""
    name = _fused_adapter(layer, x, args, kwargs)
    if name is None:
        return type(layer).forward(layer, x, *args, **kwargs)
    from ktrain_lora.lora_4bit import linear_lora_4bit  # bitsandbytes, imported where a layer is 4-bit

    lora_a, lora_b, scaling = layer.lora_A[name], layer.lora_B[name], layer.scaling[name]
    summed = linear_lora_4bit(layer.base_layer, x, lora_a.weight, lora_b.weight, scaling)
    if summed is not None:
        return summed
    update = lora_b(lora_a(x) * scaling)
    result = layer.base_layer(x)
    return (result + update).to(result.dtype)


def install(model: torch.nn.Module) -> int:
    """Give every peft LoRA ``Linear`` and bitsandbytes ``Linear4bit`` layer of ``model`` its fused forward;
    returns how many layers took it."""
    from peft.tuners.lora.layer import Linear

    forwards = {Linear: fused_forward}
    bnb = sys.modules.get("peft.tuners.lora.bnb")  # imported by peft where a base is quantized
    if bnb is not None and hasattr(bnb, "Linear4bit"):
        forwards[bnb.Linear4bit] = fused_forward_4bit
    layers = [module for module in model.modules() if type(module) in forwards]
    for layer in layers:
        layer.forward = types.MethodType(forwards[type(layer)], layer)
    return len(layers)
