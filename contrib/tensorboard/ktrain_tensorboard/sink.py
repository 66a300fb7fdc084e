"""The ``tensorboard`` metric sink: every logged number as a scalar of its step, in ``output_dir/tensorboard``."""

from __future__ import annotations

from typing import Any

from torch.utils.tensorboard import SummaryWriter

FOLDER = "tensorboard"


class TensorBoardSink:
    """Writes one scalar per metric and step; TensorBoard reads the folder while the run goes on."""

    def __init__(self, writer: SummaryWriter):
        self.writer = writer

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """One scalar per number in ``metrics``, at ``step``; flushed, so TensorBoard shows it at once."""
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(name, value, step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def open_sink(run: Any) -> TensorBoardSink | None:
    """The sink for ``run`` (rank 0), or None when the config does not set ``use_tensorboard``."""
    if not run.config.use_tensorboard:
        return None
    return TensorBoardSink(SummaryWriter(log_dir=str(run.output_dir / FOLDER)))
