"""The config key of ktrain-plugin-flash-attention, and where its GPU default applies (no torch here)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import attrs

from ktrain.config.fast_defaults import GpuDefault, attention
from ktrain.config.keys import key

CAPABILITIES = (9, 10)
"""The major compute capabilities FlashAttention-4's kernels are built for (Hopper, Blackwell)."""

ATTENTION = ("sdpa", "flex_attention")
"""The attention implementations whose kernels the key replaces: SDPA's flash operators, FlexAttention's backend."""
INSTALL = "pip install 'ktrain-plugin-flash-attention[kernels]' (flash-attn-4)"
OFF = "set flash_attention_4: false"


def installed() -> bool:
    """Whether FlashAttention-4 (``flash_attn.cute``) is installed, found without importing it."""
    spec = importlib.util.find_spec("flash_attn")
    places = spec.submodule_search_locations if spec is not None else None
    return bool(places) and any((Path(place) / "cute" / "interface.py").is_file() for place in places)


def _unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why FlashAttention-4 is not the fast default of ``config`` (None: it is)."""
    if attention(config) not in ATTENTION:
        return "the attention is neither PyTorch's SDPA nor FlexAttention"
    if getattr(config, "context_parallel_size", None) not in (None, 1):
        return "context parallelism (its ring attention's calls of the flash kernels were not checked with it)"
    if capability is None or capability[0] not in CAPABILITIES:
        return "FlashAttention-4's kernels are for GPUs of compute capability 9.x and 10.x"
    if not installed():
        return f"flash-attn-4 is not installed ({INSTALL})"
    return None


@attrs.define(kw_only=True)
class FlashAttentionKeys:
    """FlashAttention-4's kernels behind PyTorch's scaled_dot_product_attention."""

    flash_attention_4: bool = key(
        False,
        "SDPA's attention without a mask runs FlashAttention-4's kernels (the flash-attn-4 package; GPUs of "
        "compute capability 9.x and 10.x), in place of cuDNN's and FlashAttention-2's; FlexAttention in compiled "
        "blocks, in training, its FLASH backend (FlashAttention-4's kernels with the block mask) in place of its "
        "Triton kernels",
        gpu_default=GpuDefault(
            True,
            "SDPA's causal attention, and FlexAttention in compiled blocks in training, run FlashAttention-4's "
            "kernels: the same computation, rounded differently",
            unless=_unless,
        ),
    )
