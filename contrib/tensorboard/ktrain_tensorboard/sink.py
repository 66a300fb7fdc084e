"""The ``tensorboard`` metric sink: every logged number as a scalar of its step, in ``output_dir/tensorboard``.

The resolved config is written once, as the text ``config`` of step 0, when the folder is new. The last
step written is kept with ``ktrain.run.tracking`` (``output_dir/tracking/tensorboard.json``, after each
step: the event file is flushed then); a resumed run writes only the steps after it, so each step is in
the event files once (the steps a killed run logged after its last checkpoint are trained again;
TensorBoard keeps their first values, with the same loss, learning rate and gradient norm). The kernel
guards the sink: TensorBoard failing (a full disk) costs one warning, the sink is dropped, training goes
on, and metrics.jsonl has every record.
"""

from __future__ import annotations

from typing import Any

from ktrain.run.tracking import TrackerRecord

FOLDER = "tensorboard"


class TensorBoardSink:
    """Writes one scalar per metric and step; TensorBoard reads the folder while the run goes on."""

    def __init__(self, writer: Any, record: TrackerRecord):
        self.writer = writer
        self.record = record

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """One scalar per number in ``metrics``, at ``step``; flushed, so TensorBoard shows it at once."""
        if self.record.holds(step):
            return
        for name, value in metrics.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                self.writer.add_scalar(name, value, step)
        self.writer.flush()
        self.record.step = step
        self.record.write()

    def close(self) -> None:
        """Flush and close the event file."""
        self.writer.close()


def open_sink(run: Any) -> TensorBoardSink | None:
    """The sink for ``run`` (rank 0), or None when the config does not set ``use_tensorboard``."""
    if not run.config.use_tensorboard:
        return None
    from torch.utils.tensorboard import SummaryWriter

    record = TrackerRecord.read(run.output_dir, "tensorboard")
    writer = SummaryWriter(log_dir=str(run.output_dir / FOLDER))
    if not record.found:
        writer.add_text("config", "```yaml\n" + run.config.to_yaml() + "```", 0)
        record.write()
    return TensorBoardSink(writer, record)
