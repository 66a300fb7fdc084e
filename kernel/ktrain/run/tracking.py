"""What a run directory remembers of an experiment tracker's run, so that a resume continues it.

A tracker (W&B, MLflow, TensorBoard event files) keeps ``output_dir/tracking/NAME.json``: the id of its
tracked run and the last step that run holds. A resumed ktrain run reads it to continue the same tracked
run, and sends nothing at or below that step: those steps are there already. (The steps a failed run
logged after its last checkpoint are trained again, and metrics.jsonl forgets them, but the tracked run
keeps their first values: the loss, learning rate and gradient norm of a repeated step are the same,
its timings are not.) The record is replaced in one rename: a killed process leaves the old or the new.
"""

from __future__ import annotations

import json
from pathlib import Path

import attrs

from ktrain.run.files import atomic_write_text

FOLDER = "tracking"


@attrs.define
class TrackerRecord:
    """The record of the tracker ``name`` in one run directory.

    ``run_id``: the tracked run's id (None for a tracker without one, or before the first write);
    ``step``: the last step the tracked run holds (-1: none); ``found``: whether the run directory had a
    record when it was read; ``floor``: the step the tracked run held when this process read the record.
    """

    path: Path
    run_id: str | None = None
    step: int = -1
    found: bool = False
    floor: int = -1

    @classmethod
    def read(cls, output_dir: Path, name: str) -> TrackerRecord:
        """The record of tracker ``name`` in ``output_dir``; an empty one (``found`` false) when it has none yet."""
        path = Path(output_dir) / FOLDER / f"{name}.json"
        if not path.is_file():
            return cls(path)
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(path, run_id=data.get("run_id"), step=data["step"], found=True, floor=data["step"])

    def start(self, run_id: str | None) -> None:
        """A new tracked run ``run_id``: it holds no step yet, so this process sends every step."""
        self.run_id, self.step, self.floor = run_id, -1, -1

    def holds(self, step: int) -> bool:
        """Whether the tracked run held ``step`` before this process began: a resumed run skips it."""
        return step <= self.floor

    def write(self) -> None:
        """Replace the record on disk (``run_id`` and ``step``) in one rename."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, json.dumps({"run_id": self.run_id, "step": self.step}))
