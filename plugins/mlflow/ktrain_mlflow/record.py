"""What the run directory remembers of its MLflow run: the run's id and the last step logged to it.

A resumed run reads it to continue the same MLflow run, and sends nothing at or below that step: those
steps are in MLflow already (the steps a killed run logged after its last checkpoint run again, and
metrics.jsonl forgets them, but MLflow keeps the first values; the loss, learning rate and gradient norm
of a step repeated after a resume are the same, its timings are not).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import attrs

PATH = Path("tracking") / "mlflow.json"


@attrs.define
class Record:
    """The MLflow run's id and the last step sent to it (-1: none)."""

    run_id: str
    step: int = -1

    @classmethod
    def read(cls, output_dir: Path) -> Record | None:
        """The record of the run in ``output_dir``, or None when it has none yet."""
        path = output_dir / PATH
        if not path.is_file():
            return None
        data = json.loads(path.read_text(encoding="utf-8"))
        return cls(run_id=data["run_id"], step=data["step"])

    def write(self, output_dir: Path) -> None:
        """Replace the record in one rename (a killed process leaves the old one or the new one)."""
        path = output_dir / PATH
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_text(json.dumps(attrs.asdict(self)), encoding="utf-8")
        os.replace(tmp, path)
