"""The states of the plugin's optimizers in one rank's memory: its answer to ``ktrain_collect_memory``.

bitsandbytes' 8-bit optimizers keep each state in a byte an element with an fp32 scale per block of
256 elements; tensors under 4096 elements keep fp32 states. Its 32-bit (and paged) ones keep fp32
states, AdamW two and Lion one. torchao's 8-bit AdamW keeps bytes with a scale per 256 elements, its
4-bit AdamW half a byte with a scale per 128, both with the same 4096-element floor. Muon is modelled as
AdamW (two states in the weight's dtype): an upper bound, as the matrices it trains keep one. No torch here.
"""

from __future__ import annotations

from typing import Any

from ktrain.memory.parts import OptimizerModel
from ktrain_optimizers.keys import MUON, NAMES, TORCHAO

MIN_QUANTIZED = 4096


def optimizer_model(name: str) -> OptimizerModel:
    """The memory model of the registered optimizer ``name``."""
    if name == MUON:
        return OptimizerModel(name)
    moments = 1 if "lion" in name else 2
    if name in TORCHAO:
        four = "4bit" in name
        return OptimizerModel(name, moments, 0.5 if four else 1, 128 if four else 256, MIN_QUANTIZED)
    if name.endswith("32bit"):
        return OptimizerModel(name, moments, 4)
    return OptimizerModel(name, moments, 1, 256, MIN_QUANTIZED)


def collect_memory(config: Any) -> dict[str, Any] | None:
    """The ``"optimizer"`` model when ``optimizer`` names one of the plugin's optimizers."""
    return {"optimizer": optimizer_model(config.optimizer)} if config.optimizer in (*NAMES, MUON) else None
