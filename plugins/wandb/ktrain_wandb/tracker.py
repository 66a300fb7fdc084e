"""The tracker: on rank 0, a W&B run that gets the resolved config once and every metrics.jsonl record.

``WandbTracker`` is the runtime object (activated by the entry module in tracked runs). It registers the
``wandb`` metric sink, which the kernel opens on rank 0 only, and uploads the model as an artifact
(``wandb_log_model``). A resumed run continues the W&B run whose id the run directory keeps
(``ktrain_wandb.record``); its last step is recorded when the W&B run finishes, since W&B writes an
offline run's file in blocks and a killed process leaves the last ones unwritten. W&B failing (no
network, a refused login) costs one warning: the sink stops, training goes on, and metrics.jsonl, written
before any sink, has every record.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

from ktrain import hookimpl
from ktrain_wandb.record import Record


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics record (what W&B charts)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class WandbSink:
    """One W&B run of one ktrain run, on rank 0; every call after a failure is a no-op."""

    def __init__(self, output_dir: Path):
        self.output_dir = output_dir
        self.wandb_run: Any = None
        self.record: Record | None = None
        self.floor = -1  # steps at or below it are in the W&B run already
        self.failed = False

    def fail(self, error: BaseException) -> None:
        """Warn once and stop logging to W&B."""
        if not self.failed:
            self.failed = True
            print(
                f"ktrain-plugin-wandb: W&B stopped logging this run ({type(error).__name__}: {error}); "
                "training goes on and metrics.jsonl has every metric",
                file=sys.stderr,
                flush=True,
            )

    def open(self, run: Any) -> None:
        """Start or continue the W&B run: the id from ``wandb_run_id`` or the run directory, else a new one."""
        import wandb

        config = run.config
        kept = Record.read(self.output_dir)
        run_id = config.wandb_run_id or (kept.run_id if kept else None)  # None: W&B makes a new one
        continued = kept is not None and kept.run_id == run_id
        self.floor = kept.step if continued else -1
        self.wandb_run = wandb.init(
            project=config.wandb_project,
            entity=config.wandb_entity,
            name=config.wandb_name or config.wandb_run_id,
            id=run_id,
            resume="allow",
            mode=config.wandb_mode,
            dir=os.environ.get("WANDB_DIR") or str(self.output_dir),
            config=None if continued else config.to_dict(),
        )
        self.record = Record(run_id=self.wandb_run.id, step=self.floor)
        self.record.write(self.output_dir)
        if config.wandb_watch not in (None, "false") and run.model is not None:
            self.wandb_run.watch(run.model, log=config.wandb_watch, log_freq=config.logging_steps)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Log ``metrics`` at ``step``, unless the W&B run has that step from before a resume."""
        if self.failed or step <= self.floor:
            return
        try:
            self.wandb_run.log(numbers(metrics), step=step)
            self.record.step = step
        except Exception as e:
            self.fail(e)

    def log_model(self, path: Path, kind: str, step: int) -> None:
        """Upload the folder ``path`` as an artifact of type ``model`` (``kind``: checkpoint or model)."""
        if self.failed:
            return
        try:
            import wandb

            artifact = wandb.Artifact(f"{kind}-{self.wandb_run.id}", type="model", metadata={"step": step})
            artifact.add_dir(str(path))
            self.wandb_run.log_artifact(artifact, aliases=[f"step-{step}", "latest"])
        except Exception as e:
            self.fail(e)

    def close(self) -> None:
        """Finish the W&B run, then record its last step: W&B holds the steps up to it from now on."""
        if self.failed or self.wandb_run is None:
            return
        try:
            self.wandb_run.finish()
            self.record.write(self.output_dir)
        except Exception as e:
            self.fail(e)


class WandbTracker:
    """The runtime object of a tracked run: the ``wandb`` metric sink and the model artifacts."""

    def __init__(self) -> None:
        self.sink: WandbSink | None = None

    @hookimpl
    def ktrain_register_metric_sinks(self, register: Any) -> None:
        """The ``wandb`` sink; the kernel opens it on rank 0 only."""
        register("wandb", self.open_sink)

    def open_sink(self, run: Any) -> WandbSink | None:
        """Open the W&B run for ``run``; None (after one warning) when W&B cannot start it."""
        sink = WandbSink(run.output_dir)
        try:
            sink.open(run)
        except Exception as e:
            sink.fail(e)
            return None
        self.sink = sink
        return sink

    @hookimpl
    def ktrain_on_checkpoint_saved(self, run: Any, step: int, path: Path) -> None:
        """``wandb_log_model: checkpoint``: each committed checkpoint, as an artifact."""
        if self.sink is not None and run.config.wandb_log_model == "checkpoint":
            self.sink.log_model(path, "checkpoint", step)

    @hookimpl
    def ktrain_on_train_end(self, run: Any, engine: Any, metrics: dict[str, float]) -> None:
        """``wandb_log_model`` ``end`` or ``checkpoint``: the exported model, as an artifact."""
        final = run.output_dir / "final"
        if self.sink is not None and run.config.wandb_log_model in ("checkpoint", "end") and final.is_dir():
            self.sink.log_model(final, "model", run.step)
