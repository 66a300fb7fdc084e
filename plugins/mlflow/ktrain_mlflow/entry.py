"""Entry module of ktrain-plugin-mlflow: the ``mlflow_*`` keys, and the tracker when they ask for it.

Imports nothing heavy: ``ktrain_mlflow.tracker`` is imported only in runs that are tracked, and it
imports mlflow only when rank 0 opens the MLflow run.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_mlflow.keys import MlflowKeys

ENABLING = ("mlflow_tracking_uri", "mlflow_experiment_name")
OPTIONS = ("mlflow_run_name", "hf_mlflow_log_artifacts")


def given(config: Any, name: str) -> bool:
    """Whether the config sets ``name`` to a real value (not left out, not null, not empty)."""
    return config.is_set(name) and getattr(config, name) not in (None, "")


def tracked(config: Any) -> bool:
    """Axolotl's rule: MLflow tracks the run when a tracking URI or an experiment name is set, unless
    ``use_mlflow`` says otherwise."""
    if given(config, "use_mlflow"):
        return bool(config.use_mlflow)
    return any(given(config, name) for name in ENABLING)


@hookimpl
def ktrain_register_config(register: Any) -> None:
    """Declare the ``mlflow_*`` keys, ``hf_mlflow_log_artifacts`` and ``use_mlflow``."""
    register(MlflowKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """MLflow keys written in a run that MLflow does not track."""
    if tracked(config):
        return
    for name in OPTIONS:
        if given(config, name):
            report.warn(
                name,
                "has no effect: MLflow tracks a run only with mlflow_tracking_uri, mlflow_experiment_name "
                "or use_mlflow: true",
            )


@hookimpl
def ktrain_activate(config: Any, activate: Any) -> None:
    """Activate the tracker in runs that MLflow tracks."""
    if not tracked(config):
        return
    keys = tuple(name for name in ("use_mlflow", *ENABLING, *OPTIONS) if given(config, name))
    activate("ktrain_mlflow.entry:tracker", keys=keys)


def tracker(config: Any) -> Any:
    """The tracker (its module imports mlflow when rank 0 opens the run): built by the kernel on the ranks."""
    from ktrain_mlflow.tracker import MlflowTracker

    return MlflowTracker()
