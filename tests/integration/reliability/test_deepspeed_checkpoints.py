"""The battery on DeepSpeed's checkpoints (ZeRO-1 preset, ``DS_ACCELERATOR=cpu``, two ranks on gloo): killed
just before the commit, a full disk while the ZeRO partitions are written, a missing partition file. Four
steps with accumulation 2, warm-up + cosine, saving every 2; ``reference`` is the uninterrupted run."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ktrain.run.checkpoints import committed_checkpoints, verify
from ktrain.testing import dataset, model_dir, read_metrics, write_config
from tests.integration.reliability.kit import KEYS, checkpoints, digest, run, same_state

pytest.importorskip("ktrain_deepspeed")
pytestmark = pytest.mark.slow
TWO = ("--nproc-per-node", "2")
DS = {**KEYS, "max_steps": 4, "deepspeed": "zero1"}
CPU = {"DS_ACCELERATOR": "cpu"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("deepspeed")
    model_dir(root, attention_dropout=0.1)
    dataset(root, 200)
    config = write_config(root, "reference.yaml", output_dir=str(root / "reference"), **DS)
    code, out = run("run", str(config), *TWO, log=root / "reference.log", env=CPU)
    assert code == 0, out[-3000:]
    return root / "reference"


def assert_same_run(run_dir: Path, reference: Path) -> None:
    assert read_metrics(run_dir) == read_metrics(reference)
    assert digest(run_dir / "final" / "model.safetensors") == digest(reference / "final" / "model.safetensors")
    assert same_state(run_dir / "checkpoints" / "step-00000004", reference / "checkpoints" / "step-00000004")


def test_killed_before_the_commit_then_disk_full_then_resumed_matches(reference: Path) -> None:
    """(a, f, b) Rank 0 killed with step 4 written but not committed; resumed, rank 1's disk fills while the
    partitions of step 4 are written (every rank exits, step 2 intact); resumed again, equal to the reference."""
    root = reference.parent
    out = root / "killed"
    config = write_config(root, "killed.yaml", output_dir=str(out), **DS)
    kill = {**CPU, "KTRAIN_FAULT": "save-before-commit:4:0:sigkill"}
    code, log = run("run", str(config), *TWO, log=root / "killed.log", env=kill)
    assert code == 1 and "rank 0 failed (exit code -9)" in log, log[-3000:]
    assert checkpoints(out) == [".tmp-step-00000004", "step-00000002"]
    full = {**CPU, "KTRAIN_FAULT": "save-shards:4:1:enospc"}
    code, log = run("run", str(config), "--resume", *TWO, log=root / "full.log", env=full)
    assert code == 2 and "Traceback" not in log and f"no space left on {out / 'checkpoints'}: need " in log
    assert [name for name in checkpoints(out) if name.startswith("step-")] == ["step-00000002"]
    assert all(verify(p) == [] for p in committed_checkpoints(out / "checkpoints"))
    code, log = run("run", str(config), "--resume", *TWO, log=root / "resumed.log", env=CPU)
    assert code == 0, log[-3000:]
    assert "step-00000002 at step 2" in log
    assert_same_run(out, reference)


def test_a_missing_partition_falls_back_to_the_previous_checkpoint(reference: Path) -> None:
    """(g) One rank's optimizer partition of step 4 is gone: resume names it, takes step 2, and matches."""
    root = reference.parent
    out = root / "damaged"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "final")
    (partition,) = (out / "checkpoints" / "step-00000004").rglob("zero_pp_rank_1_*optim_states.pt")
    partition.unlink()
    config = write_config(root, "damaged.yaml", output_dir=str(out), **DS)
    code, log = run("run", str(config), "--resume", *TWO, log=root / "damaged.log", env=CPU)
    assert code == 0, log[-3000:]
    assert f"warning: checkpoint step-00000004 is damaged: {partition} is missing" in log
    assert "step-00000002 at step 2" in log
    assert_same_run(out, reference)
