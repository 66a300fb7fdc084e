"""The tracker: on rank 0, an MLflow run that gets the resolved config once and every metrics.jsonl record.

``MlflowTracker`` is the runtime object (activated by the entry module in tracked runs). It registers the
``mlflow`` metric sink, which the kernel opens on rank 0 only, and copies checkpoints and the final model
into the run's artifacts (``hf_mlflow_log_artifacts``). A resumed run continues the MLflow run whose id
the run directory keeps (``ktrain.run.tracking``, as ``tracking/mlflow.json``, its last step written after
every logged step) and sends no step that run holds. The kernel guards the sink: MLflow failing (a bad
URI, a server that does not answer) costs one warning, the sink is dropped, training goes on, and
metrics.jsonl has every record.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from ktrain import hookimpl
from ktrain.run.tracking import TrackerRecord

PARAMS_PER_BATCH = 100  # MLflow's limit of parameters in one log_batch
PARAM_LENGTH = 6000  # MLflow's limit of a parameter's value


def params(config: dict[str, Any]) -> dict[str, str]:
    """The resolved config as MLflow parameters: each key's value as text (lists and mappings as JSON)."""
    out = {}
    for name, value in config.items():
        text = value if isinstance(value, str) else json.dumps(value, default=str)
        out[name] = text[:PARAM_LENGTH]
    return out


def numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numeric entries of a metrics record (what MLflow charts)."""
    return {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class MlflowSink:
    """One MLflow run of one ktrain run, on rank 0."""

    def __init__(self, run: Any):
        """Continue the MLflow run the run directory names, or start one in the experiment and log the config."""
        from mlflow import MlflowClient
        from mlflow.entities import Param

        config = run.config
        self.client = MlflowClient(tracking_uri=config.mlflow_tracking_uri)
        self.record = TrackerRecord.read(run.output_dir, "mlflow")
        if self.record.found:
            self.client.update_run(self.record.run_id, status="RUNNING")
            return
        name = config.mlflow_experiment_name or "Default"
        experiment = self.client.get_experiment_by_name(name)
        experiment_id = experiment.experiment_id if experiment else self.client.create_experiment(name)
        self.record.start(self.client.create_run(experiment_id, run_name=config.mlflow_run_name).info.run_id)
        self.record.write()
        logged = [Param(k, v) for k, v in params(config.to_dict()).items()]
        for start in range(0, len(logged), PARAMS_PER_BATCH):
            self.client.log_batch(self.record.run_id, params=logged[start : start + PARAMS_PER_BATCH])

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        """Log ``metrics`` at ``step``, unless the MLflow run has that step from before a resume."""
        if self.record.holds(step):
            return
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        batch = [Metric(k, v, now, step) for k, v in numbers(metrics).items()]
        self.client.log_batch(self.record.run_id, metrics=batch)
        if step != self.record.step:
            self.record.step = step
            self.record.write()

    def log_folder(self, path: Path) -> None:
        """Copy the folder ``path`` into the run's artifacts, under its name."""
        self.client.log_artifacts(self.record.run_id, str(path), artifact_path=path.name)

    def close(self) -> None:
        """Mark the MLflow run finished (a resume marks it running again)."""
        self.client.set_terminated(self.record.run_id)


class MlflowTracker:
    """The runtime object of a tracked run: the ``mlflow`` metric sink and the artifacts."""

    @hookimpl
    def ktrain_register_metric_sinks(self, register: Any) -> None:
        """The ``mlflow`` sink; the kernel opens it on rank 0 only."""
        register("mlflow", MlflowSink)

    @hookimpl
    def ktrain_on_checkpoint_saved(self, run: Any, step: int, path: Path) -> None:
        """``hf_mlflow_log_artifacts``: each committed checkpoint, into the artifacts."""
        if run.config.hf_mlflow_log_artifacts:
            run.log.send("mlflow", "log_artifacts", lambda sink: sink.log_folder(path))

    @hookimpl
    def ktrain_on_train_end(self, run: Any, engine: Any, metrics: dict[str, float]) -> None:
        """``hf_mlflow_log_artifacts``: the exported model, into the artifacts."""
        final = run.output_dir / "final"
        if run.config.hf_mlflow_log_artifacts and final.is_dir():
            run.log.send("mlflow", "log_artifacts", lambda sink: sink.log_folder(final))
