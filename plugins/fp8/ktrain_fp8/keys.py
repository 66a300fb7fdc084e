"""The config keys of ktrain-plugin-fp8: Axolotl's ``fp8`` keys and the plugin's own (no torch here)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable
from typing import Any, Literal

import attrs

from ktrain.config.fast_defaults import GpuDefault
from ktrain.config.keys import key

RECIPES = ("tensorwise", "rowwise", "delayed")
"""The float8 recipes ``fp8_recipe`` accepts: torchao's (one scale a tensor, or one a row, from the tensor
itself) and the plugin's delayed scaling (one scale a tensor, from earlier micro-steps: ``ktrain_fp8.delayed``)."""
MIN_CAPABILITY = (8, 9)
"""The first CUDA compute capability with float8 tensor cores (Ada, then Hopper's 9.0)."""


def excluded(name: str, patterns: Iterable[str]) -> bool:
    """Whether the dotted module name ``name`` is one of ``fp8_exclude_modules``'s ``patterns``: the name
    itself, a dotted suffix of it (``lm_head``, ``mlp.down_proj``) or a glob pattern on the whole name
    (``model.layers.0.*``)."""
    return any(name == p or name.endswith(f".{p}") or fnmatch.fnmatchcase(name, p) for p in patterns)


def _float8_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why a float8 fast default does not apply to ``config`` (None: it does): ``fp8`` is off, or the GPU has
    no float8 tensor cores."""
    if not getattr(config, "fp8", False):
        return "fp8 is off"
    if capability is not None and tuple(capability) < MIN_CAPABILITY:
        return "the GPU has no float8 tensor cores"
    return None


def _delayed_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why ``fp8_recipe: delayed`` is not the fast default of ``config`` (None: it is)."""
    if config.fp8_enable_fsdp_float8_all_gather:
        return "the float8 all-gather (fp8_enable_fsdp_float8_all_gather) works with tensorwise only"
    return _float8_unless(config, capability)


DELAYED = GpuDefault(
    "delayed",
    "each tensor is cast to float8 with the scale of the largest absolute maximum of the last fp8_amax_history_len "
    "micro-steps instead of its own (the first micro-step with its own), so no pass over the tensor precedes its "
    "cast, and each SwiGLU MLP runs as one function (fp8_fused_mlp)",
    unless=_delayed_unless,
    off="tensorwise",
)
"""``fp8_recipe``'s GPU default: delayed scaling, with the MLPs fused."""

FAST_ACCUMULATION = GpuDefault(
    True,
    "the backward's float8 products (the input's and the weight's gradients) accumulate the fast way, as the "
    "forward's do: fewer exact partial sums over the tokens",
    unless=_float8_unless,
)
"""``fp8_fast_accumulation``'s GPU default."""


@attrs.define(kw_only=True)
class Fp8Keys:
    """Float8 matrix multiplies in the linear layers (torchao): weights, gradients and optimizer unchanged."""

    fp8: bool = key(
        False,
        "multiply the linear layers' inputs in float8 (torchao's float8 training; a GPU of compute capability "
        "8.9 or later); the weights, their gradients and the optimizer keep their dtypes",
    )
    fp8_recipe: Literal["tensorwise", "rowwise", "delayed"] = key(
        "tensorwise",
        "the scaling: torchao's tensorwise (one scale a tensor, from its own absolute maximum) or rowwise (one "
        "a row, finer); or delayed (one scale a tensor, from the largest maximum of the last "
        "fp8_amax_history_len micro-steps, so the cast needs no pass over the tensor before it)",
        gpu_default=DELAYED,
    )
    fp8_amax_history_len: int = key(
        16, "fp8_recipe: delayed: how many training micro-steps of absolute maxima a layer's scales are taken from"
    )
    fp8_fast_accumulation: bool = key(
        False,
        "accumulate the backward's float8 products (the input's and the weight's gradients) the fast way too, as "
        "the forward's always are: fewer exact partial sums over the tokens, 3-5 ms less on the 1.5B shape's blocks",
        gpu_default=FAST_ACCUMULATION,
    )
    fp8_fused_mlp: bool = key(
        True,
        "fp8_recipe: delayed: run each SwiGLU MLP whose three projections are float8 as one function, whose backward "
        "reads the activations once for the SiLU's gradient, the casts and their maxima (one Triton pass on a GPU)",
    )
    fp8_exclude_modules: list[str] = attrs.field(
        factory=lambda: ["lm_head"],
        metadata={
            "help": "linear layers kept in bf16, by name: a name matches a module whose dotted name is it or "
            "ends with '.name', or a glob pattern (fnmatch) on the whole dotted name"
        },
    )
    fp8_skip_small_layers: bool = key(
        True,
        "keep in bf16 the layers too small to gain from float8 under the recipe (torchao's measured "
        "thresholds); layers whose dimensions are not multiples of 16 always stay in bf16",
    )
    fp8_enable_fsdp_float8_all_gather: bool = key(
        False, "FSDP2 gathers the converted layers' weights in float8 (half the bytes); needs fsdp_version: 2"
    )
