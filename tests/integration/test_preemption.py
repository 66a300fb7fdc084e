"""Pre-emption loses nothing: SIGUSR1 (SLURM's warning before the time limit) or SIGTERM finishes the step on
every rank, saves its checkpoint and exits 138 or 143; the run started again with
``auto_resume_from_checkpoints: true`` continues from it and logs the losses of a run never stopped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ktrain.run import stop
from ktrain.testing import dataset, ktrain, model_dir, read_metrics, write_config

STEPS = 6
STALLED = 3  # the step during which the signal arrives: every rank sleeps before its optimizer step


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("preemption")
    model_dir(root, attention_dropout=0.0)  # each rank draws its own dropout masks: compare ranks without
    dataset(root, 200)
    return root


@pytest.fixture(scope="module")
def never_stopped(root: Path) -> dict[int, float]:
    """Losses of the run never stopped: one process, the global batch of 8 rows as 2 micro-batches of 4."""
    config = write_config(
        root, "never.yaml", max_steps=STEPS, gradient_accumulation_steps=2, output_dir=str(root / "never")
    )
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr
    return read_metrics(root / "never")


def _complete_lines(path: Path) -> int:
    return path.read_text(encoding="utf-8").count("\n") if path.is_file() else 0


def _stop_at_step(args: list[str], out: Path, signum: int) -> subprocess.CompletedProcess:
    """Run ``ktrain ARGS``, send ``signum`` to it while step ``STALLED`` runs, and wait for its end."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "KTRAIN_FAULT": f"optimizer:{STALLED}:*:sleep=3"}
    process = subprocess.Popen(
        [sys.executable, "-m", "ktrain.cli", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
    )
    deadline = time.monotonic() + 180
    while _complete_lines(out / "metrics.jsonl") < STALLED - 1:  # step 2 logged: the ranks are in step 3
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.05)
    process.send_signal(signum)
    stdout, stderr = process.communicate(timeout=120)
    return subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)


def test_a_stopped_run_saves_its_step_and_resumes_as_if_never_stopped(
    root: Path, never_stopped: dict[int, float]
) -> None:
    """SIGUSR1 to the launcher of 2 ranks, as SLURM sends it: the agent passes it on. (SIGTERM takes the same
    path in the ranks: ``ktrain.run.stop.SAVING``.)"""
    signum, ranks = signal.SIGUSR1, 2
    name = signal.Signals(signum).name
    out = root / name
    config = write_config(
        root,
        f"{name}.yaml",
        max_steps=STEPS,
        gradient_accumulation_steps=2 // ranks,
        auto_resume_from_checkpoints=True,
        output_dir=str(out),
    )
    args = ["run", str(config), "--nproc-per-node", str(ranks)]
    stopped = _stop_at_step(args, out, signum)
    assert stopped.returncode == 128 + signum, stopped.stderr
    assert f"stopped by {name}; every rank stopped; --resume continues from step-{STALLED:08d}" in stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == [f"step-{STALLED:08d}"]
    assert not (out / "final").exists()
    again = ktrain(*args)  # what a requeued job runs: the same command
    assert again.returncode == 0, again.stderr
    assert f"at step {STALLED}" in again.stdout
    losses = read_metrics(out)
    assert losses.keys() == never_stopped.keys() == set(range(1, STEPS + 1))
    for step, loss in never_stopped.items():  # fp32; on 2 ranks only the order of the gradient sums differs
        assert losses[step] == pytest.approx(loss, rel=1e-5), step


def test_sigterm_and_sigusr1_stop_after_the_step_sigint_before_it() -> None:
    """The decision every rank takes alike from every rank's signal: a pre-emption signal (the larger when both)
    is kept for after the step and its save; SIGINT on any rank stops before the optimizer step."""
    with stop.handled():
        stop.agree([0.0, float(signal.SIGUSR1), float(signal.SIGTERM)])
        assert stop.agreed() == signal.SIGTERM
    with stop.handled():
        assert stop.agreed() == 0
        with pytest.raises(stop.Interrupted) as raised:
            stop.agree([float(signal.SIGUSR1), float(signal.SIGINT)])
        assert raised.value.exit_code == 130
