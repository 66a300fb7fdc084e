"""The transformer blocks of a Hugging Face model, as the plugins and the kernel's optimizer find them."""

from __future__ import annotations

import torch


def transformer_blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules whose class is in one of the model's ``_no_split_modules``, in registration order."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]
