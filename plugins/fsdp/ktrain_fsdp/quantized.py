"""bitsandbytes 4-bit weights under ``cpu_ram_efficient_loading``: read and quantized once, by rank 0.

A 4-bit layer (``bitsandbytes.nn.Linear4bit``) keeps its weight as packed storage (two 4-bit codes a
byte, stored as ``bnb_4bit_quant_storage``) plus a *quantization state* beside it: the per-block scales
(``absmax``), the code book and, with double quantization, the scales' own scales. The state is not a
parameter, so FSDP neither shards nor broadcasts it, and the layer's ``state_dict`` spells it as extra
keys (``...weight.absmax``, ``...weight.quant_map``, ...) that are no parameter of the sharded model.

So, off rank 0, ``quantized_skeleton`` turns a meta model into the same 4-bit layers with meta packed
weights of the shape rank 0's quantization gives them; after sharding, the packed weights travel in the
full state dict's broadcast (``tensor_state``: the extra keys left out) and ``share_quant_states`` sends
each layer's quantization state from rank 0 to the others. Nothing here imports bitsandbytes unless
the model has 4-bit layers.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def is_4bit(module: torch.nn.Module) -> bool:
    """Whether ``module`` is a bitsandbytes 4-bit layer (by its own weight's class, so that an adapter around
    one is not; bitsandbytes is not imported)."""
    return type(module._parameters.get("weight")).__name__ == "Params4bit"


def four_bit_layers(model: torch.nn.Module) -> dict[str, torch.nn.Module]:
    """The 4-bit layers of ``model`` by name."""
    return {name: m for name, m in model.named_modules() if is_4bit(m)}


def packed_shape(shape: torch.Size, storage: torch.dtype) -> tuple[int, int]:
    """The shape bitsandbytes gives a weight of ``shape`` packed in 4 bits as ``storage`` (``quantize_4bit``)."""
    per_element = 2 * torch.empty((), dtype=storage).element_size()
    return ((shape.numel() + 1) // per_element, 1)


def quantized_skeleton(model: torch.nn.Module, quantization: Any, dtype: torch.dtype) -> torch.nn.Module:
    """Turn the meta ``model`` into the 4-bit model ``quantization`` describes, still on meta, weights packed.

    transformers' own quantizer picks the layers (the output layer and ``llm_int8_skip_modules`` stay as
    they are); each 4-bit weight then gets the packed shape and storage dtype that quantizing gives it,
    so that every rank shards the same shapes.
    """
    import bitsandbytes as bnb
    from transformers.quantizers.auto import AutoHfQuantizer

    quantizer = AutoHfQuantizer.from_config(quantization, pre_quantized=False)
    with torch.device("meta"):
        quantizer.preprocess_model(model=model, dtype=dtype, device_map=None, checkpoint_files=None)
    quantizer.postprocess_model(model)
    for layer in four_bit_layers(model).values():
        weight = layer.weight
        storage = layer.quant_storage
        layer.weight = bnb.nn.Params4bit(
            torch.empty(packed_shape(weight.shape, storage), dtype=storage, device="meta"),
            requires_grad=False,
            blocksize=weight.blocksize,
            compress_statistics=weight.compress_statistics,
            quant_type=weight.quant_type,
            quant_storage=storage,
            module=layer,
            bnb_quantized=True,
        )
    return model


def tensor_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """``model.state_dict()`` without the quantization-state entries of its 4-bit layers (parameters and
    persistent buffers only: what a sharded model's state dict holds)."""
    names = {n for n, _ in model.named_parameters(remove_duplicate=False)}
    names |= {n for n, _ in model.named_buffers(remove_duplicate=False)}
    return {k: v for k, v in model.state_dict().items() if k in names}


def _on_cpu(state: dict[str, Any]) -> dict[str, Any]:
    """The tensors of a packed quantization state on CPU: what is pickled must not name rank 0's device."""
    return {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}


def share_quant_states(model: torch.nn.Module, rank: int, device: torch.device) -> int:
    """Send the quantization state of every 4-bit layer from rank 0 to the other ranks (collective).

    Called on every rank whose model has 4-bit layers; returns how many layers got a state.
    """
    layers = four_bit_layers(model)
    if not layers:
        return 0
    sent = [None]
    if rank == 0:
        sent = [{name: _on_cpu(layer.quant_state.as_dict(packed=True)) for name, layer in layers.items()}]
    dist.broadcast_object_list(sent, src=0)
    if rank != 0:
        from bitsandbytes.functional import QuantState

        for name, layer in layers.items():
            state = QuantState.from_dict(dict(sent[0][name]), device=device)
            layer.quant_state = state
            layer.weight.quant_state = state
    return len(layers)
