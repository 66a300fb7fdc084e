"""The battery on two ranks (DDP, gloo, a process-group timeout of 10 s): the agent and a rank killed inside a
save with the other orphaned, a second run refused, NaN on one rank, a rank that exits, is killed or
stalls, and ``--max-restarts 1``. ``reference`` is the uninterrupted two-rank run the others must match."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ktrain.run.checkpoints import committed_checkpoints, verify
from ktrain.run.directory import WORKER_LOCK_FILE
from ktrain.testing import dataset, model_dir, read_metrics, write_config
from tests.integration.reliability.kit import (
    PG_TIMEOUT_S,
    checkpoints,
    digest,
    file_hashes,
    run,
    same_state,
    start,
    wait_unlocked,
)

pytestmark = pytest.mark.slow
TWO = ("--nproc-per-node", "2")
KEYS = dict(max_steps=6, save_steps=2, gradient_accumulation_steps=2, warmup_steps=2, lr_scheduler="cosine")


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ranks")
    model_dir(root, attention_dropout=0.1)  # each rank draws its own dropout masks: its RNG must resume too
    dataset(root, 200)
    config = write_config(root, "reference.yaml", output_dir=str(root / "reference"), **KEYS)
    code, out = run("run", str(config), *TWO, log=root / "reference.log")
    assert code == 0, out[-3000:]
    return root / "reference"


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert read_metrics(run_dir) == read_metrics(reference)
    assert digest(run_dir / "final" / "model.safetensors") == digest(reference / "final" / "model.safetensors")
    assert same_state(run_dir / "checkpoints" / "step-00000006", reference / "checkpoints" / "step-00000006")


def test_agent_killed_in_a_save_orphans_a_rank_and_a_second_run_is_refused(reference: Path) -> None:
    """(a, i) Rank 1 kills the agent and itself inside the save of step 4 while rank 0 is still writing it.
    While the run lives, and while its orphaned rank 0 holds the run directory, another run there is
    refused; once the orphan is gone, resume takes step 2 (never the partial step 4) and matches."""
    root = reference.parent
    out = root / "orphaned"
    config = write_config(root, "orphaned.yaml", output_dir=str(out), **KEYS)
    # rank 1 holds the agent alive 15 s into the save (time for the second run to start on a loaded machine),
    # then kills it; rank 0 stays in the save 25 s, an orphan holding the run directory for the third run
    faults = "save-start:4:1:sleep=15,save-shards:4:1:sigkill-agent,save-shards:4:0:sleep=25"
    first = start("run", str(config), *TWO, log=root / "orphaned.log", env={"KTRAIN_FAULT": faults})
    staging = out / "checkpoints" / ".tmp-step-00000004"
    while not staging.exists() and first.poll() is None:
        time.sleep(0.1)
    code, log = run("run", str(config), "--resume", log=root / "second.log")
    assert code == 2 and "is in use by pid" in log and "Traceback" not in log, log[-3000:]
    assert first.wait(timeout=60) == -9  # the agent, killed
    code, log = run("run", str(config), "--resume", *TWO, log=root / "third.log")
    assert code == 2 and "ranks of an earlier run still hold" in log, log[-3000:]
    wait_unlocked(out / WORKER_LOCK_FILE, timeout=25 + PG_TIMEOUT_S + 30)
    assert checkpoints(out) == [".tmp-step-00000004", "step-00000002"]
    code, log = run("run", str(config), "--resume", *TWO, log=root / "resumed.log")
    assert code == 0, log[-3000:]
    assert "step-00000002 at step 2" in log
    assert_same_run(out, reference)


def test_nan_on_one_rank_stops_every_rank_before_the_step(reference: Path) -> None:
    """(e) Rank 1's loss is NaN at step 3: the run stops naming step and rank; no checkpoint after step 2."""
    root = reference.parent
    config = write_config(root, "nan.yaml", output_dir=str(root / "nan"), **{**KEYS, "save_steps": 1})
    code, log = run("run", str(config), *TWO, log=root / "nan.log", env={"KTRAIN_FAULT": "loss:3:1:nan"})
    assert code == 1
    assert "non-finite loss at step 3 on rank 1: stopped before the optimizer step" in log
    assert checkpoints(root / "nan") == ["step-00000001", "step-00000002"]
    assert sorted(read_metrics(root / "nan")) == [1, 2]


def test_nan_skip_policy_skips_the_step_on_every_rank(reference: Path) -> None:
    """(e) nan_policy: skip: step 3 changes nothing (weights, optimizer, schedule) on any rank; step 4 trains."""
    root = reference.parent
    keys = {**KEYS, "save_steps": 1, "max_steps": 4, "nan_policy": "skip"}
    config = write_config(root, "skip.yaml", output_dir=str(root / "skip"), **keys)
    code, log = run("run", str(config), *TWO, log=root / "skip.log", env={"KTRAIN_FAULT": "loss:3:1:nan"})
    assert code == 0, log[-3000:]
    assert "non-finite loss at step 3 on rank 1: step skipped (nan_policy: skip)" in log
    step = {n: file_hashes(root / "skip" / "checkpoints" / f"step-0000000{n}") for n in (2, 3, 4)}
    for name in ("model.safetensors", "optimizer.pt", "scheduler.pt"):
        assert step[3][name] == step[2][name] != step[4][name], name


@pytest.mark.parametrize(
    ("fault", "first_error"),
    [
        ("exit", "exit code 3); the other ranks were stopped.\n  first error: none: the rank exited with code 3"),
        ("sigkill", "exit code -9); the other ranks were stopped.\n  first error: none: killed by SIGKILL"),
    ],
)
def test_a_rank_that_exits_or_is_killed_ends_the_run(reference: Path, fault: str, first_error: str) -> None:
    """(h) The agent stops the other rank at once and names the failed one, not the peer that lost it."""
    root = reference.parent
    config = write_config(root, f"{fault}.yaml", output_dir=str(root / fault), max_steps=50)
    started = time.monotonic()
    code, log = run("run", str(config), *TWO, log=root / f"{fault}.log", env={"KTRAIN_FAULT": f"forward:2:1:{fault}"})
    assert code == 1
    assert f"rank 1 failed ({first_error}" in log
    assert time.monotonic() - started < 60


def test_a_stalled_rank_ends_the_run_within_the_timeout(reference: Path) -> None:
    """(h) Rank 1 stalls at step 2: rank 0's collective times out after KTRAIN_PG_TIMEOUT_S and its error
    is shown; the run ends within the timeout plus a few seconds of the stall."""
    root = reference.parent
    config = write_config(root, "stall.yaml", output_dir=str(root / "stall"), max_steps=50)
    process = start("run", str(config), *TWO, log=root / "stall.log", env={"KTRAIN_FAULT": "forward:2:1:hang"})
    metrics = root / "stall" / "metrics.jsonl"
    while not (metrics.exists() and metrics.read_text()) and process.poll() is None:
        time.sleep(0.05)
    stalled = time.monotonic()  # step 1 logged: the ranks are in step 2
    assert process.wait(timeout=PG_TIMEOUT_S + 60) == 1
    waited = time.monotonic() - stalled
    log = (root / "stall.log").read_text()
    assert "rank 0 failed" in log and "first error:" in log
    assert PG_TIMEOUT_S - 1 < waited < PG_TIMEOUT_S + 10, waited


def test_max_restarts_resumes_and_matches(reference: Path) -> None:
    """(h, b) Rank 1 exits at step 5; with --max-restarts 1 every rank restarts from step 4 and the run ends
    equal to the uninterrupted one."""
    root = reference.parent
    config = write_config(root, "restart.yaml", output_dir=str(root / "restart"), **KEYS)
    code, log = run(
        "run",
        str(config),
        *TWO,
        "--max-restarts",
        "1",
        log=root / "restart.log",
        env={"KTRAIN_FAULT": "forward:5:1:exit"},
    )
    assert code == 0, log[-3000:]
    assert "step-00000004 at step 4" in log
    assert all(verify(p) == [] for p in committed_checkpoints(root / "restart" / "checkpoints"))
    assert_same_run(root / "restart", reference)
