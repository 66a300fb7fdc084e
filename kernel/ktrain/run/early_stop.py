"""Early stopping on the eval loss, and the best checkpoint kept as the final model.

As Hugging Face's ``EarlyStoppingCallback`` with ``load_best_model_at_end`` (what Axolotl's
``early_stopping_patience`` sets up): after each evaluation the eval loss is compared with the best before
it; an evaluation that does not lower it counts one, one that does resets the count, and the run stops once
the count reaches ``early_stopping_patience``. A checkpoint saved at a step with an evaluation is ranked by
that step's eval loss; at the end the best of them is loaded back, so the final model holds its weights,
and checkpoint rotation (``save_total_limit``) never removes it. The trainer evaluates at every save while
this is on, so each checkpoint has its eval loss. The whole state is part of each checkpoint: a resumed run
counts and ranks as the run that went through.
"""

from __future__ import annotations

import math
from typing import Any


class EarlyStop:
    """The eval losses seen so far: the best one, the evaluations since it, the best checkpoint.

    ``state`` is what ``state_dict`` returned when the checkpoint a run resumes from was saved (None: a fresh run).
    """

    def __init__(self, patience: int | None, keep_best: bool, state: dict[str, Any] | None = None):
        self.patience = patience or 0
        self.on = keep_best or self.patience > 0
        state = state or {}
        best = state.get("best_loss")
        self.best_loss = math.inf if best is None else best
        self.since_best: int = state.get("since_best", 0)
        self.last_eval = _pair(state.get("last_eval"))
        self.best_checkpoint = _pair(state.get("best_checkpoint"))

    def observe(self, step: int, eval_loss: float) -> bool:
        """Take the eval loss of ``step``; True when the run is to stop here."""
        self.last_eval = (step, eval_loss)
        if eval_loss < self.best_loss:
            self.best_loss, self.since_best = eval_loss, 0
        else:
            self.since_best += 1
        return self.patience > 0 and self.since_best >= self.patience

    def saving(self, step: int) -> None:
        """A checkpoint of ``step`` is about to be saved: rank it by the eval loss of its step, if it has one."""
        if self.last_eval is None or self.last_eval[0] != step:
            return
        if self.best_checkpoint is None or self.last_eval[1] < self.best_checkpoint[1]:
            self.best_checkpoint = self.last_eval

    def best_step(self) -> int | None:
        """The step of the best checkpoint so far (the one rotation keeps and the final model holds), or None."""
        return self.best_checkpoint[0] if self.on and self.best_checkpoint else None

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint records to resume the counting and ranking (JSON values)."""
        return {
            "best_loss": self.best_loss if math.isfinite(self.best_loss) else None,
            "since_best": self.since_best,
            "last_eval": list(self.last_eval) if self.last_eval else None,
            "best_checkpoint": list(self.best_checkpoint) if self.best_checkpoint else None,
        }


def _pair(value: list[Any] | None) -> tuple[int, float] | None:
    """A ``[step, eval_loss]`` read back from a checkpoint's state as a tuple."""
    return (int(value[0]), float(value[1])) if value else None
