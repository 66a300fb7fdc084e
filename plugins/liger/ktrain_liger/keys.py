"""The config keys of ktrain-plugin-liger: one ``liger_*`` key per op, and the ops they ask for (no torch here)."""

from __future__ import annotations

from typing import Any

import attrs

from ktrain.config.fast_defaults import GpuDefault, model_type
from ktrain.config.keys import key

# key -> the op it patches (the role is op:<op>); liger_swiglu is the older spelling of liger_glu_activation.
OPS = {
    "liger_rope": "rope",
    "liger_rms_norm": "rms_norm",
    "liger_glu_activation": "swiglu",
    "liger_swiglu": "swiglu",
    "liger_layer_norm": "layer_norm",
    "liger_cross_entropy": "cross_entropy",
    "liger_fused_linear_cross_entropy": "fused_linear_cross_entropy",
}


BLOCK_KEYS = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_swiglu")
"""The keys of the kernels inside the transformer blocks, the work that compiled blocks fuse too."""

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "phi3")
"""Architectures whose rope, RMSNorm and SwiGLU liger-kernel patches (its Llama-like decoders), where the three
kernels are a GPU default."""

PARALLEL_SIZES = ("tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree")
"""Mesh sizes under which Liger's kernels are not a default: their modules would hold split weights."""


def _quantized(config: Any) -> bool:
    """A 4-bit or 8-bit base (ktrain-plugin-lora's keys, where it is installed)."""
    keys = ("load_in_4bit", "load_in_8bit", "qlora")
    return any(getattr(config, name, False) for name in keys) or getattr(config, "adapter", None) == "qlora"


def _compiled(config: Any) -> bool:
    """Whether the run compiles its blocks (ktrain-plugin-compile's ``torch_compile``): as written, else its GPU
    default, which a quantized base and Liger's block kernels asked for turn off."""
    if getattr(config, "torch_compile", None) is None:  # ktrain-plugin-compile is not installed
        return False
    if config.is_set("torch_compile"):
        return bool(config.torch_compile)
    return not _quantized(config) and not any(config.is_set(k) and getattr(config, k) for k in BLOCK_KEYS)


def _blocks_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why Liger's rope, RMSNorm and SwiGLU are not the fast default of ``config`` (None: they are)."""
    if any(getattr(config, name, None) not in (None, 1) for name in PARALLEL_SIZES):
        return "a parallel size other than 1"
    if _compiled(config):
        return "compiled blocks fuse the same work (torch_compile)"
    if model_type(config) not in SUPPORTED:
        return "the model's architecture is not one whose three block kernels liger-kernel has (or not known)"
    return None


def _glu_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """``_blocks_unless``, and ``liger_swiglu`` (the older spelling) written."""
    if config.is_set("liger_swiglu"):
        return "liger_swiglu, its older spelling, is written"
    return _blocks_unless(config, capability)


def _default(changes: str, unless: Any = _blocks_unless) -> GpuDefault:
    """A Liger kernel's GPU default where the blocks are not compiled."""
    return GpuDefault(True, f"{changes}: the same computation, rounded differently", unless=unless)


@attrs.define(kw_only=True)
class LigerKeys:
    """Liger kernels: fused Triton kernels that replace ops of Hugging Face models (CUDA GPUs only)."""

    liger_rope: bool = key(
        False,
        "Liger's rotary position embedding kernel",
        gpu_default=_default("Liger's Triton kernel rotates the queries and keys in place of the model's rope"),
    )
    liger_rms_norm: bool = key(
        False,
        "Liger's RMSNorm kernel",
        gpu_default=_default("Liger's Triton kernel computes each RMSNorm"),
    )
    liger_glu_activation: bool = key(
        False,
        "Liger's fused SwiGLU (or GeGLU, for Gemma) MLP activation",
        gpu_default=_default("Liger's Triton kernel computes silu(gate) * up", _glu_unless),
    )
    liger_swiglu: bool | None = key(None, "older spelling of liger_glu_activation")
    liger_layer_norm: bool = key(False, "Liger's LayerNorm kernel (architectures that use LayerNorm)")
    liger_cross_entropy: bool = key(False, "Liger's cross entropy over the materialized logits")
    liger_fused_linear_cross_entropy: bool = key(
        False, "the output layer and the cross entropy fused, in chunks: the logits are never materialized"
    )
    liger_flce_chunk_mem_const: int = key(
        1,
        "liger_fused_linear_cross_entropy's chunks hold logits of up to this many times the hidden states' "
        "size (Liger's chunk_mem_const): fewer, larger chunks run faster matrix multiplies in more memory",
    )


def requested(config: Any) -> dict[str, str]:
    """The keys set true, each with the op it patches (``liger_swiglu`` stands for ``liger_glu_activation``)."""
    chosen = {name: op for name, op in OPS.items() if getattr(config, name)}
    if "liger_glu_activation" in chosen:
        chosen.pop("liger_swiglu", None)
    return chosen
