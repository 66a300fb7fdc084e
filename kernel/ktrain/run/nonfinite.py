"""The check before every optimizer step: a NaN or inf loss on any rank stops the run, or skips the step.

Each rank marks its own slot of a vector the size of the world and the vector is summed over ranks, so
every rank learns which ranks saw a non-finite loss and all take the same decision. ``nan_policy:
stop`` (the default) raises ``NonFiniteLoss`` on every rank, naming the step and the ranks, before any
weight changes; the loop never reaches the save of that step. ``nan_policy: skip`` drops the step's
gradients on every rank and goes on: the weights, the optimizer and the schedule stay as they were.
The same collective carries each rank's stop request (``ktrain.run.stop``): a rank sent SIGINT or
SIGTERM stops every rank here, before the optimizer step.

``LossWatchdog`` is the check on the logged loss: above ``loss_watchdog_threshold`` on
``loss_watchdog_patience`` logged steps in a row, the run stops (every rank sees the same reduced loss,
so all stop at the same step). The checkpoints saved until then stay; no final model is written.
"""

from __future__ import annotations

import math
import sys
from typing import Any

from ktrain.run import distributed, faults, stop
from ktrain.run.context import Run


class NonFiniteLoss(RuntimeError):
    """A NaN or inf loss under ``nan_policy: stop``."""


class LossTooHigh(RuntimeError):
    """The logged loss stayed above ``loss_watchdog_threshold`` for ``loss_watchdog_patience`` logged steps."""


class LossWatchdog:
    """Counts the logged steps in a row whose loss is above the threshold; stops the run at the patience."""

    def __init__(self, threshold: float | None, patience: int):
        self.threshold, self.patience, self.streak = threshold, patience, 0

    def observe(self, step: int, loss: float) -> None:
        """Take the logged ``loss`` of ``step``; raise ``LossTooHigh`` when the streak reaches the patience."""
        if self.threshold is None:
            return
        self.streak = self.streak + 1 if loss > self.threshold else 0
        if self.streak >= self.patience:
            raise LossTooHigh(
                f"loss {loss:.4g} at step {step}, above loss_watchdog_threshold ({self.threshold:g}) on "
                f"{self.streak} logged step(s) in a row (loss_watchdog_patience): stopped"
            )


def skipped(run: Run, engine: Any, step: int, loss_sum: float) -> bool:
    """Check the loss of ``step`` on every rank; True when the step is to be skipped (its gradients dropped)."""
    value = faults.loss(step, run.rank, loss_sum)
    flags = [0.0] * (2 * run.world_size)  # per rank: a non-finite loss, then the signal it was asked to stop by
    flags[run.rank] = 0.0 if math.isfinite(value) else 1.0
    flags[run.world_size + run.rank] = float(stop.requested())
    summed = distributed.all_reduce_sum(flags)
    stop.agree(summed[run.world_size :])
    ranks = [rank for rank, flag in enumerate(summed[: run.world_size]) if flag]
    if not ranks:
        return False
    where = f"step {step} on rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"
    if run.config.nan_policy == "skip" and not engine.owns_backward:
        if run.is_main:
            print(f"ktrain: warning: non-finite loss at {where}: step skipped (nan_policy: skip)", file=sys.stderr)
        engine.optimizer.zero_grad(set_to_none=True)
        return True
    why = (
        "the engine owns the optimizer step and cannot skip it"
        if run.config.nan_policy == "skip"
        else "set nan_policy: skip to skip such steps"
    )
    raise NonFiniteLoss(f"non-finite loss at {where}: stopped before the optimizer step ({why})")
