"""The config keys of ktrain-plugin-liger: one ``liger_*`` key per op, and the ops they ask for (no torch here)."""

from __future__ import annotations

from typing import Any

import attrs

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


@attrs.define(kw_only=True)
class LigerKeys:
    """Liger kernels: fused Triton kernels that replace ops of Hugging Face models (CUDA GPUs only)."""

    liger_rope: bool = key(False, "Liger's rotary position embedding kernel")
    liger_rms_norm: bool = key(False, "Liger's RMSNorm kernel")
    liger_glu_activation: bool = key(False, "Liger's fused SwiGLU (or GeGLU, for Gemma) MLP activation")
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
