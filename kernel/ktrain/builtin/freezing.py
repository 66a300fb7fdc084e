"""``unfrozen_parameters``: train only the parameters whose names match one of the patterns.

Patterns are read as Axolotl reads them: a regular expression matched from the start of the parameter's
name (``model.layers.0.mlp.up_proj.weight``), where a period is a literal period unless a ``+`` follows
it. Axolotl's trailing index range (``embed_tokens.weight$[:32000]``) is not supported. The model is
frozen this way before an adapter wraps it; under an adapter the adapter chooses what trains, so the
kernel's check refuses the two together. Imports nothing heavy: the check compiles the patterns.
"""

from __future__ import annotations

import re
from typing import Any

RANGE = re.compile(r"\$\[\s*-?\d*\s*:\s*-?\d*\s*\]$")


def name_pattern(text: str) -> re.Pattern[str]:
    """The compiled pattern of one ``unfrozen_parameters`` entry; ``ValueError`` names what is wrong."""
    if RANGE.search(text):
        raise ValueError(f"{text!r}: index ranges are not supported; unfreeze the whole parameter")
    try:
        return re.compile(re.sub(r"\.(?!\+)", r"\\.", text))
    except re.error as e:
        raise ValueError(f"{text!r} is not a regular expression: {e}") from None


def freeze_except(model: Any, patterns: list[str]) -> int:
    """Leave trainable only the parameters of ``model`` whose names match a pattern; return how many do.
    ``ValueError`` when none does (nothing would train)."""
    compiled = [name_pattern(text) for text in patterns]
    kept = 0
    for name, param in model.named_parameters():
        param.requires_grad = any(pattern.match(name) for pattern in compiled)
        kept += param.requires_grad
    if not kept:
        raise ValueError(f"unfrozen_parameters: no parameter of the model matches {patterns}; nothing would train")
    return kept
