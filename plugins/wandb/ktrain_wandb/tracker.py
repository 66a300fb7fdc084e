"""The tracker: on rank 0, a W&B run that gets the resolved config once and every metrics.jsonl record.

``WandbTracker`` is the runtime object (activated by the entry module in tracked runs). It registers the
``wandb`` metric sink, which the kernel opens on rank 0 only, and uploads the model as an artifact
(``wandb_log_model``). A resumed run continues the W&B run whose id the run directory keeps
(``ktrain.run.tracking``, as ``tracking/wandb.json``) and sends no step that run holds; its last step is
recorded when the W&B run finishes, since W&B writes an offline run's file in blocks and a killed process
leaves the last ones unwritten (so a killed process's steps after its checkpoint are sent again, and W&B,
online, ignores a step it has). The kernel guards the sink: W&B failing (no network, a refused login)
costs one warning, the sink is dropped, training goes on, and metrics.jsonl has every record.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ktrain import hookimpl
from ktrain.run.tracking import TrackerRecord


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics record (what W&B charts)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class WandbSink:
    """One W&B run of one ktrain run, on rank 0."""

    def __init__(self, run: Any):
        """Start or continue the W&B run: the id from ``wandb_run_id`` or the run directory, else a new one."""
        import wandb

        config = run.config
        self.output_dir = run.output_dir
        self.record = TrackerRecord.read(self.output_dir, "wandb")
        run_id = config.wandb_run_id or self.record.run_id  # None: W&B makes a new one
        continued = self.record.found and self.record.run_id == run_id
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
        if not continued:
            self.record.start(self.wandb_run.id)
        self.record.write()
        if config.wandb_watch not in (None, "false") and run.model is not None:
            self.wandb_run.watch(run.model, log=config.wandb_watch, log_freq=config.logging_steps)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Log ``metrics`` at ``step``, unless the W&B run has that step from before a resume."""
        if self.record.holds(step):
            return
        self.wandb_run.log(numbers(metrics), step=step)
        self.record.step = step

    def log_model(self, path: Path, kind: str, step: int) -> None:
        """Upload the folder ``path`` as an artifact of type ``model`` (``kind``: checkpoint or model)."""
        import wandb

        artifact = wandb.Artifact(f"{kind}-{self.wandb_run.id}", type="model", metadata={"step": step})
        artifact.add_dir(str(path))
        self.wandb_run.log_artifact(artifact, aliases=[f"step-{step}", "latest"])

    def close(self) -> None:
        """Finish the W&B run, then record its last step: W&B holds the steps up to it from now on."""
        self.wandb_run.finish()
        self.record.write()


class WandbTracker:
    """The runtime object of a tracked run: the ``wandb`` metric sink and the model artifacts."""

    @hookimpl
    def ktrain_register_metric_sinks(self, register: Any) -> None:
        """The ``wandb`` sink; the kernel opens it on rank 0 only."""
        register("wandb", WandbSink)

    @hookimpl
    def ktrain_on_checkpoint_saved(self, run: Any, step: int, path: Path) -> None:
        """``wandb_log_model: checkpoint``: each committed checkpoint, as an artifact."""
        if run.config.wandb_log_model == "checkpoint":
            run.log.send("wandb", "log_model", lambda sink: sink.log_model(path, "checkpoint", step))

    @hookimpl
    def ktrain_on_train_end(self, run: Any, engine: Any, metrics: dict[str, float]) -> None:
        """``wandb_log_model`` ``end`` or ``checkpoint``: the exported model, as an artifact."""
        final = run.output_dir / "final"
        if run.config.wandb_log_model in ("checkpoint", "end") and final.is_dir():
            run.log.send("wandb", "log_model", lambda sink: sink.log_model(final, "model", run.step))
