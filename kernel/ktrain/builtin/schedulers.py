"""The learning-rate schedules the kernel registers by name, and the default owner of ``lr_scheduler``.

Each is a ``LambdaLR``: linear warm-up from 0 over ``warmup`` steps, then the named shape. The first
step trains at ``lr / warmup`` (not at 0), as in Hugging Face's schedules shifted by one.
"""

from __future__ import annotations

import math
from typing import Any

from torch.optim.lr_scheduler import LambdaLR

from ktrain import hookimpl


def _warm(step: int, warmup: int) -> float | None:
    return (step + 1) / (warmup + 1) if step < warmup else None


def cosine(optimizer: Any, config: Any, total_steps: int, warmup_steps: int) -> LambdaLR:
    """Cosine from the peak to ``cosine_min_lr_ratio`` of it (default 0), reached at
    ``cosine_constant_lr_ratio`` of all steps (Axolotl's rounding down) and held from there."""
    floor = config.cosine_min_lr_ratio or 0.0
    ratio = config.cosine_constant_lr_ratio
    if ratio is not None:
        total_steps = int(total_steps * ratio)

    def factor(step: int) -> float:
        warm = _warm(step, warmup_steps)
        if warm is not None:
            return warm
        progress = min(1.0, (step - warmup_steps) / max(1, total_steps - warmup_steps))
        return floor + (1 - floor) * 0.5 * (1 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, factor)


def linear(optimizer: Any, config: Any, total_steps: int, warmup_steps: int) -> LambdaLR:
    """Linear decay from the peak to 0."""

    def factor(step: int) -> float:
        warm = _warm(step, warmup_steps)
        return warm if warm is not None else max(0.0, 1 - (step - warmup_steps) / max(1, total_steps - warmup_steps))

    return LambdaLR(optimizer, factor)


def constant(optimizer: Any, config: Any, total_steps: int, warmup_steps: int) -> LambdaLR:
    """The peak throughout (warm-up ignored; see constant_with_warmup)."""
    return LambdaLR(optimizer, lambda step: 1.0)


def constant_with_warmup(optimizer: Any, config: Any, total_steps: int, warmup_steps: int) -> LambdaLR:
    """Linear warm-up, then the peak."""

    def factor(step: int) -> float:
        warm = _warm(step, warmup_steps)
        return warm if warm is not None else 1.0

    return LambdaLR(optimizer, factor)


def warmup_steps(config: Any, total_steps: int) -> int:
    if config.warmup_steps is not None:
        return config.warmup_steps
    return math.ceil((config.warmup_ratio or 0.0) * total_steps)


class DefaultScheduler:
    """Builds the schedule registered under ``lr_scheduler``."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_build_lr_scheduler(self, optimizer: Any, run: Any, total_steps: int) -> LambdaLR:
        factory = run.plan.schedulers.get(self.config.lr_scheduler, "lr_scheduler")
        return factory(optimizer, self.config, total_steps, warmup_steps(self.config, total_steps))
