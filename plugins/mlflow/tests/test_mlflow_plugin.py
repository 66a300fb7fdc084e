"""ktrain-plugin-mlflow: real 2-rank runs tracked in a local MLflow store (sqlite), read back with MlflowClient."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from mlflow import MlflowClient

from ktrain.testing import KtrainProject, dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records

pytest_plugins = ["ktrain.testing"]

TIMINGS = ("tokens_per_s", "peak_mem_gib")  # measured again when a step runs again after a resume
EXPERIMENT = "ktrain-tests"


def store_uri(root: Path) -> str:
    return f"sqlite:///{root / 'mlflow.db'}"


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("mlflow")
    model_dir(root)
    dataset(root, 96)
    return root


@pytest.fixture(scope="module")
def store(root: Path) -> MlflowClient:
    """A sqlite store whose experiment keeps its artifacts in the test's folder."""
    client = MlflowClient(tracking_uri=store_uri(root))
    client.create_experiment(EXPERIMENT, artifact_location=(root / "artifacts").as_uri())
    return client


@pytest.fixture(scope="module")
def resumed(root: Path, store: MlflowClient) -> Path:
    """2 ranks, 6 steps, checkpoints every 2, eval every 2; rank 0 dies in step 4 (step 3 logged after the
    checkpoint of step 2), and the resume runs steps 3 to 6 again."""
    config = write_config(
        root,
        mlflow_tracking_uri=store_uri(root),
        mlflow_experiment_name=EXPERIMENT,
        mlflow_run_name="tiny",
        hf_mlflow_log_artifacts=True,
        max_steps=6,
        save_steps=2,
        val_set_size=16,
        eval_steps=2,
    )
    killed = ktrain("run", str(config), "--nproc-per-node", "2", env={"KTRAIN_FAULT": "forward:4:0:exit"})
    assert killed.returncode != 0, killed.stdout[-2000:]
    assert max(records(root / "out")) == 3
    done = ktrain("run", str(config), "--nproc-per-node", "2", "--resume")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return root / "out"


def the_run(store: MlflowClient) -> object:
    (run,) = store.search_runs([store.get_experiment_by_name(EXPERIMENT).experiment_id])
    return run


def test_a_killed_and_resumed_run_is_one_mlflow_run_with_each_step_once(resumed: Path, store: MlflowClient) -> None:
    run = the_run(store)
    assert run.info.run_id == json.loads((resumed / "tracking" / "mlflow.json").read_text())["run_id"]
    assert run.info.run_name == "tiny" and run.info.status == "FINISHED"
    logged_names = {k for line in (resumed / "metrics.jsonl").read_text().splitlines() for k in json.loads(line)}
    assert set(run.data.metrics) == logged_names - {"step"}
    for name in run.data.metrics:
        history = store.get_metric_history(run.info.run_id, name)
        steps = [m.step for m in history]
        assert len(steps) == len(set(steps)), f"{name}: a step logged twice: {steps}"
        logged = records(resumed, name)
        assert sorted(steps) == sorted(logged), name
        if name not in TIMINGS:
            assert {m.step: m.value for m in history} == logged, name
    assert sorted(records(resumed, "loss")) == [1, 2, 3, 4, 5, 6]
    assert sorted(m.step for m in store.get_metric_history(run.info.run_id, "eval_loss")) == [2, 4, 6]


def test_the_resolved_config_is_logged_once(resumed: Path, store: MlflowClient) -> None:
    params = the_run(store).data.params
    assert params["learning_rate"] == "0.003" and params["max_steps"] == "6" and params["optimizer"] == "adamw_torch"
    assert json.loads(params["datasets"])[0]["type"] == "chat_template"


def test_checkpoints_and_the_final_model_are_artifacts(resumed: Path, store: MlflowClient) -> None:
    run = the_run(store)
    folders = {a.path for a in store.list_artifacts(run.info.run_id)}
    assert {"step-00000002", "step-00000004", "step-00000006", "final"} <= folders
    assert "model.safetensors" in {Path(a.path).name for a in store.list_artifacts(run.info.run_id, "final")}


def test_a_bad_tracking_uri_warns_once_and_the_run_finishes(ktrain_project: KtrainProject) -> None:
    config = ktrain_project.config(mlflow_tracking_uri="nosuchscheme://nowhere", max_steps=3)
    done = ktrain_project.ktrain("run", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "metric sink 'mlflow'" in line]
    assert len(warnings) == 1 and "(ktrain-plugin-mlflow " in warnings[0], done.stderr[-3000:]
    assert warnings[0].startswith("ktrain: warning: ") and "training goes on" in warnings[0], warnings
    assert sorted(records(ktrain_project.root / "runs" / "run", "loss")) == [1, 2, 3]


@pytest.mark.parametrize("keys", [{"mlflow_tracking_uri": None}, {"mlflow_experiment_name": "x", "use_mlflow": False}])
def test_no_mlflow_run_without_its_keys(ktrain_project: KtrainProject, keys: dict) -> None:
    plan = ktrain_project.plan(**keys)
    assert not any(act.plugin.name == "mlflow" for act in plan.plugins.activations)
