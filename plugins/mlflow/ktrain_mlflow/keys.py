"""The plugin's config keys: Axolotl's ``mlflow_*`` names and meanings, ``hf_mlflow_log_artifacts`` and
``use_mlflow``."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key


@attrs.define(kw_only=True)
class MlflowKeys:
    """MLflow: the run is tracked when ``mlflow_tracking_uri`` or ``mlflow_experiment_name`` is set (or
    ``use_mlflow: true``)."""

    use_mlflow: bool | None = key(
        None,
        "track the run in MLflow (default: when mlflow_tracking_uri or mlflow_experiment_name is set); false: do not",
    )
    mlflow_tracking_uri: str | None = key(
        None,
        "MLflow tracking URI: a server (http://host:5000) or a local store (sqlite:///mlflow.db); default: MLflow's",
    )
    mlflow_experiment_name: str | None = key(None, "MLflow experiment of the run, made if missing (default: Default)")
    mlflow_run_name: str | None = key(None, "name of the MLflow run (default: MLflow's)")
    hf_mlflow_log_artifacts: bool = key(
        False, "copy each committed checkpoint and the final model into the MLflow run's artifacts"
    )
