"""The engine: DDP averages the gradients, ZeroRedundancyOptimizer keeps each rank's share of the optimizer state.

The kernel still owns the step (backward, accumulation, clipping, schedule): DDP skips the gradient
all-reduce on all but the last micro-batch, clipping sees the whole averaged gradient on every rank,
and each rank updates only the parameters whose optimizer state it holds, then broadcasts them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch.distributed.optim import ZeroRedundancyOptimizer

from ktrain.engine import DataParallelEngine


def sharded_optimizer(
    groups: list[dict[str, Any]], build_optimizer: Callable[[Any], Any], bucket_view: bool
) -> ZeroRedundancyOptimizer:
    """A ZeroRedundancyOptimizer whose per-rank optimizer is what the run's ``optimizer`` owner builds.

    ZeRO hands each rank's share of ``groups`` to ``build_optimizer``; the hyperparameters that
    optimizer chose (lr, betas, ...) are copied onto ZeRO's own groups, where the schedule reads and
    sets them and from where ZeRO passes them back to the local optimizer at every step.
    """
    zero = ZeroRedundancyOptimizer(
        groups,
        optimizer_class=lambda params, **_: build_optimizer(params),
        parameters_as_bucket_view=bucket_view,
    )
    for outer, local in zip(zero.param_groups, zero.optim.param_groups, strict=True):
        outer.update({k: v for k, v in local.items() if k != "params"})
    return zero


class ZeroRedundancyEngine(DataParallelEngine):
    """DDP around the model (one gradient all-reduce per optimizer step) and a sharded optimizer (a plain one
    on a single rank)."""

    def full_optimizer_state(self) -> dict[str, Any] | None:
        """The whole optimizer state, gathered to rank 0 (collective); None on the other ranks."""
        if not isinstance(self.optimizer, ZeroRedundancyOptimizer):
            return self.optimizer.state_dict()
        self.optimizer.consolidate_state_dict(to=0)
        return self.optimizer.state_dict() if torch.distributed.get_rank() == 0 else None

    def local_optimizer_bytes(self) -> int:
        """Bytes of optimizer state this rank holds."""
        local = self.optimizer.optim if isinstance(self.optimizer, ZeroRedundancyOptimizer) else self.optimizer
        return sum(t.numel() * t.element_size() for state in local.state.values() for t in state.values() if t.ndim > 0)
