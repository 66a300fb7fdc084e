"""LoRA's update computed without passes of its own over the layer's output.

peft's forward of a LoRA ``Linear`` (and of a bitsandbytes ``Linear4bit``) computes the update
``lora_B(lora_A(x)) * scaling`` as a tensor of the layer's whole output, multiplies it by the scale and
adds it to the base's output: two passes over a ``[tokens, out_features]`` tensor, twice more in the
backward, after an input cast to the adapter's fp32 dtype (undone by autocast) and, for 4-bit layers, a
copy of the base's output. Here the scale never meets a tensor of the output's size:

- a ``Linear`` layer puts the scale and the sum into the epilogue of the second matrix multiply
  (``addmm(base(x), lora_A(x), B^T, alpha=scaling)``), which rounds once instead of three times; its
  backward multiplies by the scale only the ``[tokens, r]`` and ``[r, out_features]`` gradients;
- a 4-bit ``Linear4bit`` layer computes the update first, scaled on its ``[tokens, r]`` side, and then the
  base's product into it (``ktrain_lora.product_4bit``: the dequantized weight's product added in the
  matrix multiply's epilogue, so the base's output is never a tensor of its own). The order matters under
  activation checkpointing: the 4-bit product keeps no tensor for its backward (only the packed weight,
  outside autograd's saved tensors), so when the last layer of a recomputed block is 4-bit (a Llama's
  ``down_proj``), PyTorch's recompute stops once the adapter's tensors are back and never runs that
  layer's dequantization and product again.

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
    result = layer.base_layer(x)
    low = layer.lora_A[name](x)
    fused = torch.addmm(
        result.reshape(-1, result.shape[-1]),
        low.reshape(-1, low.shape[-1]),
        layer.lora_B[name].weight.t(),
        alpha=layer.scaling[name],
    )
    return fused.view(result.shape).to(result.dtype)


def fused_forward_4bit(layer: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """The forward of a peft LoRA ``Linear4bit`` layer: the update scaled on its low-rank side, the base's
    4-bit product last."""
    name = _fused_adapter(layer, x, args, kwargs)
    if name is None:
        return type(layer).forward(layer, x, *args, **kwargs)
    from ktrain_lora.product_4bit import product_4bit  # bitsandbytes, imported where a layer is 4-bit

    update = layer.lora_B[name](layer.lora_A[name](x) * layer.scaling[name])
    summed = product_4bit(layer.base_layer, x, update)
    if summed is not None:
        return summed
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
