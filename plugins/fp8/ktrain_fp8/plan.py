"""Which linear layers of a model become float8, and why each other one stays in bf16.

The plan reads only the modules' names, classes and weight shapes, so it is computed the same on a model
on the ``meta`` device, on a CPU or on a GPU, before anything is converted. A layer stays in bf16 when
its name is excluded (``fp8_exclude_modules``), when a dimension is not a multiple of 16 (float8 matrix
multiplies need it), or, with ``fp8_skip_small_layers``, when it is below the sizes at which torchao
measured float8 slower than bf16 for the recipe (its ``_auto_filter_for_recipe`` thresholds, H100).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from ktrain_fp8.keys import excluded

if TYPE_CHECKING:
    import torch


def too_small(recipe: str, out_features: int, in_features: int) -> bool:
    """Whether a ``out_features x in_features`` layer is below the sizes where float8 gains under ``recipe``."""
    n, k = out_features, in_features
    if recipe == "rowwise":
        return n <= 2048 or k <= 1024 or (n <= 4096 and k <= 2048)
    return k <= 4096 and n <= 1024


@attrs.frozen
class ConversionPlan:
    """The linear layers to convert, by dotted name, and those kept in bf16 with the reason."""

    recipe: str
    converted: tuple[str, ...]
    kept: dict[str, str]

    def describe(self) -> str:
        """One line: how many layers become float8, and the kept ones grouped by reason."""
        reasons: dict[str, list[str]] = {}
        for name, reason in self.kept.items():
            reasons.setdefault(reason, []).append(name.rsplit(".", 1)[-1])
        kept = "; ".join(
            f"{len(names)} {reason} ({', '.join(sorted(set(names)))})" for reason, names in sorted(reasons.items())
        )
        total = len(self.converted) + len(self.kept)
        return f"{len(self.converted)} of {total} linear layers in float8 ({self.recipe})" + (
            f", kept in bf16: {kept}" if kept else ""
        )


def conversion_plan(
    model: torch.nn.Module, recipe: str, exclude: Iterable[str], skip_small: bool = True
) -> ConversionPlan:
    """The plan for ``model``'s ``torch.nn.Linear`` layers (subclasses included, as torchao swaps them)."""
    import torch

    exclude = tuple(exclude)
    converted, kept = [], {}
    for name, module in model.named_modules():
        if not isinstance(module, torch.nn.Linear):
            continue
        reason = kept_because(name, *module.weight.shape, recipe, exclude, skip_small)
        if reason:
            kept[name] = reason
        else:
            converted.append(name)
    return ConversionPlan(recipe, tuple(converted), kept)


def kept_because(
    name: str, out_features: int, in_features: int, recipe: str, exclude: Iterable[str], skip_small: bool = True
) -> str | None:
    """Why the linear layer ``name`` of ``out_features x in_features`` stays in bf16, or None: it is converted."""
    if excluded(name, tuple(exclude)):
        return "excluded by name"
    if out_features % 16 or in_features % 16:
        return "not multiples of 16"
    if skip_small and too_small(recipe, out_features, in_features):
        return "too small to gain"
    return None
