"""The optimizer names of ktrain-plugin-optimizers and the library class behind each (no torch here).

The names are those of Axolotl's configs (Hugging Face Trainer's ``optim`` names, and Axolotl's ``ao_*``
spellings of the torchao ones). The plugin declares no config keys: ``optimizer`` chooses, and the
kernel's ``learning_rate``, ``adam_beta1``, ``adam_beta2``, ``adam_epsilon`` and ``weight_decay`` set them.
"""

from __future__ import annotations

BITSANDBYTES: dict[str, str] = {
    "adamw_bnb_8bit": "AdamW8bit",
    "adamw_8bit": "AdamW8bit",
    "paged_adamw_8bit": "PagedAdamW8bit",
    "paged_adamw_32bit": "PagedAdamW32bit",
    "lion_8bit": "Lion8bit",
    "lion_32bit": "Lion32bit",
    "paged_lion_8bit": "PagedLion8bit",
    "paged_lion_32bit": "PagedLion32bit",
}
"""Optimizer name -> class of ``bitsandbytes.optim``."""

TORCHAO: dict[str, str] = {
    "adamw_torch_8bit": "AdamW8bit",
    "adamw_torch_4bit": "AdamW4bit",
    "ao_adamw_8bit": "AdamW8bit",
    "ao_adamw_4bit": "AdamW4bit",
}
"""Optimizer name -> class of ``torchao.optim``."""

NAMES: tuple[str, ...] = (*BITSANDBYTES, *TORCHAO)
"""Every name of a library optimizer the plugin registers."""

MUON = "muon"
"""Muon on the hidden matrices with AdamW on the rest (``ktrain_optimizers.muon``, torch's own classes)."""


def library(name: str) -> str:
    """``"bitsandbytes"`` or ``"torchao"``: the library of a registered optimizer name."""
    return "bitsandbytes" if name in BITSANDBYTES else "torchao"


def class_name(name: str) -> str:
    """The class of the library that a registered optimizer name builds."""
    return BITSANDBYTES.get(name) or TORCHAO[name]
