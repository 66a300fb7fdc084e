"""The optimizers of ktrain-plugin-optimizers, built from bitsandbytes' and torchao's classes.

Each parameter group keeps its ``weight_decay`` (the kernel's groups: ``weight_decay`` on matrices, 0 on
the rest); the learning rate, betas and epsilon come from the kernel's keys. torchao keeps its states as
tensor subclasses (``OptimState8bit``, ``OptimState4bit``): they are allowed to ``torch.load``'s
``weights_only`` reader here, so that a checkpoint's ``optimizer.pt`` loads on resume.
"""

from __future__ import annotations

import importlib
from typing import Any

import torch

from ktrain_optimizers.keys import class_name, library


def allow_torchao_states() -> None:
    """Let ``torch.load(weights_only=True)`` rebuild torchao's quantized optimizer states."""
    from torchao.optim.subclass_4bit import OptimState4bit
    from torchao.optim.subclass_8bit import OptimState8bit

    torch.serialization.add_safe_globals([OptimState8bit, OptimState4bit])


def build(name: str, params: Any, config: Any) -> torch.optim.Optimizer:
    """The optimizer registered as ``name`` over the parameter groups ``params``."""
    cls = getattr(importlib.import_module(f"{library(name)}.optim"), class_name(name))
    kwargs: dict[str, Any] = {"lr": config.learning_rate, "betas": (config.adam_beta1, config.adam_beta2)}
    if "Lion" not in cls.__name__:  # Lion has no epsilon
        kwargs["eps"] = config.adam_epsilon
    if library(name) == "torchao":
        allow_torchao_states()
    return cls(params, **kwargs)
