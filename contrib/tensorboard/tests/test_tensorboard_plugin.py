"""ktrain-plugin-tensorboard: a real run writes TensorBoard events that read back as its metrics; ``ktrain plot``."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ktrain.testing import KtrainProject, read_metrics
from ktrain_tensorboard.plot import figure, series

pytest_plugins = ["ktrain.testing"]


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory, ktrain_model_dir: Path, ktrain_dataset: Path) -> Path:
    """One 1-rank run of 4 steps with use_tensorboard, evaluated at steps 2 and 4."""
    project = KtrainProject(tmp_path_factory.mktemp("tensorboard"), ktrain_model_dir, ktrain_dataset)
    config = project.config("use_tensorboard: true\nval_set_size: 16\neval_steps: 2\nwarmup_steps: 2\n")
    return project.train(config)


def test_events_read_back_as_the_logged_metrics(run_dir: Path) -> None:
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    assert {"loss", "eval_loss", "lr", "grad_norm", "tokens_per_s"} <= set(events.Tags()["scalars"])
    for name in ("loss", "eval_loss", "lr", "tokens_per_s"):
        logged = read_metrics(run_dir, name)
        written = {e.step: e.value for e in events.Scalars(name)}
        assert written.keys() == logged.keys(), name
        for step, value in logged.items():  # TensorBoard keeps float32
            assert written[step] == pytest.approx(value, rel=1e-6), (name, step)
    assert sorted(read_metrics(run_dir, "eval_loss")) == [2, 4]


def test_no_events_without_the_key(ktrain_project: KtrainProject) -> None:
    run = ktrain_project.train(ktrain_project.config("max_steps: 1"))
    assert (run / "metrics.jsonl").is_file() and not (run / "tensorboard").exists()


def test_plot_writes_a_png(run_dir: Path, ktrain_project: KtrainProject) -> None:
    output = run_dir.parent / "plot.png"
    done = ktrain_project.ktrain("plot", str(run_dir), "--output", str(output))
    assert done.returncode == 0, done.stderr
    header = output.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", header[16:24]) == (600, 660)  # 6 x 6.6 inches at 100 dpi


def test_the_plot_draws_each_metric_as_logged(run_dir: Path) -> None:
    fig = figure(series(run_dir / "metrics.jsonl"), "run")
    drawn = {line.get_label(): line.get_data() for ax in fig.axes for line in ax.get_lines()}
    assert [ax.get_ylabel() for ax in fig.axes] == ["loss", "learning rate", "tokens/s"]
    assert set(drawn) == {"loss", "eval_loss", "lr", "tokens_per_s"}
    for name, (steps, values) in drawn.items():
        logged = read_metrics(run_dir, name)
        assert list(steps) == sorted(logged) and list(values) == [logged[s] for s in sorted(logged)], name


def test_plot_of_a_folder_without_metrics_is_a_clear_error(tmp_path: Path, ktrain_project: KtrainProject) -> None:
    done = ktrain_project.ktrain("plot", str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip() == f"ktrain plot: {tmp_path} has no metrics.jsonl; give the output_dir of a run"


def test_a_failed_and_resumed_run_writes_each_step_once_and_the_config_once(ktrain_project: KtrainProject) -> None:
    config = ktrain_project.config("use_tensorboard: true\nmax_steps: 5\nsave_steps: 2\n")
    ktrain_project.env["KTRAIN_FAULT"] = "forward:4:0:raise"  # step 3 is logged after the checkpoint of step 2
    failed = ktrain_project.ktrain("run", str(config))
    assert failed.returncode != 0
    del ktrain_project.env["KTRAIN_FAULT"]
    run_dir = ktrain_project.train(config, "--resume")
    events = EventAccumulator(str(run_dir / "tensorboard"), purge_orphaned_data=False)
    events.Reload()
    for name in ("loss", "lr", "grad_norm", "tokens_per_s"):
        steps = [e.step for e in events.Scalars(name)]
        assert sorted(steps) == sorted(read_metrics(run_dir, name)) == [1, 2, 3, 4, 5], (name, steps)
    for name in ("loss", "lr", "grad_norm"):  # the same after an exact resume; timings are measured again
        written = {e.step: e.value for e in events.Scalars(name)}
        assert written == pytest.approx(read_metrics(run_dir, name), rel=1e-6), name
    (text,) = events.Tensors("config/text_summary")
    assert "learning_rate: 0.003" in text.tensor_proto.string_val[0].decode()
