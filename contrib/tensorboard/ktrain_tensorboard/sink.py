"""The ``tensorboard`` metric sink: every logged number as a scalar of its step, in ``output_dir/tensorboard``.

The resolved config is written once, as the text ``config`` of step 0, when the folder is new. The last
step written is kept in ``output_dir/tracking/tensorboard.json`` (after each step: the event file is
flushed then); a resumed run writes only the steps after it, so each step is in the event files once
(the steps a killed run logged after its last checkpoint are trained again; TensorBoard keeps their
first values, with the same loss, learning rate and gradient norm). TensorBoard failing (a full disk)
costs one warning: the sink stops, training goes on, and metrics.jsonl has every record.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

FOLDER = "tensorboard"
RECORD = Path("tracking") / "tensorboard.json"


class TensorBoardSink:
    """Writes one scalar per metric and step; TensorBoard reads the folder while the run goes on."""

    def __init__(self, writer: Any, output_dir: Path, floor: int):
        self.writer = writer
        self.output_dir = output_dir
        self.floor = floor  # steps at or below it are in the event files already
        self.failed = False

    def fail(self, error: BaseException) -> None:
        """Warn once and stop writing events."""
        if not self.failed:
            self.failed = True
            print(
                f"ktrain-plugin-tensorboard: TensorBoard stopped logging this run ({type(error).__name__}: {error}); "
                "training goes on and metrics.jsonl has every metric",
                file=sys.stderr,
                flush=True,
            )

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """One scalar per number in ``metrics``, at ``step``; flushed, so TensorBoard shows it at once."""
        if self.failed or step <= self.floor:
            return
        try:
            for name, value in metrics.items():
                if isinstance(value, (int, float)) and not isinstance(value, bool):
                    self.writer.add_scalar(name, value, step)
            self.writer.flush()
            write_record(self.output_dir, step)
        except Exception as e:
            self.fail(e)

    def close(self) -> None:
        """Flush and close the event file."""
        try:
            self.writer.close()
        except Exception as e:
            self.fail(e)


def read_record(output_dir: Path) -> int | None:
    """The last step written to the event files of ``output_dir``, or None before the first."""
    path = output_dir / RECORD
    return json.loads(path.read_text(encoding="utf-8"))["step"] if path.is_file() else None


def write_record(output_dir: Path, step: int) -> None:
    """Replace the record in one rename (a killed process leaves the old one or the new one)."""
    path = output_dir / RECORD
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps({"step": step}), encoding="utf-8")
    os.replace(tmp, path)


def open_sink(run: Any) -> TensorBoardSink | None:
    """The sink for ``run`` (rank 0), or None when the config does not set ``use_tensorboard`` or the event
    file cannot be opened (after one warning)."""
    if not run.config.use_tensorboard:
        return None
    from torch.utils.tensorboard import SummaryWriter

    last = read_record(run.output_dir)
    sink = TensorBoardSink(None, run.output_dir, -1 if last is None else last)
    try:
        sink.writer = SummaryWriter(log_dir=str(run.output_dir / FOLDER))
        if last is None:
            sink.writer.add_text("config", "```yaml\n" + run.config.to_yaml() + "```", 0)
            write_record(run.output_dir, -1)
    except Exception as e:
        sink.fail(e)
        return None
    return sink
