"""The battery on the kernel's own checkpoints (``ktrain-full``), one process: SIGKILL anywhere, a full disk,
damaged checkpoints. Every run is 6 steps with dropout, shuffled data, accumulation 2, warm-up + cosine,
saving every 2 steps; ``reference`` is the uninterrupted run that each faulted run must end equal to."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ktrain.run.checkpoints import committed_checkpoints, verify
from ktrain.run.manifest import NoSpaceLeft, ensure_space
from ktrain.testing import dataset, model_dir, read_metrics, write_config
from tests.integration.reliability.kit import KEYS, checkpoints, digest, flip_byte, run, same_state, truncate

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run (its folder); the model and data beside it."""
    root = tmp_path_factory.mktemp("kernel")
    model_dir(root, attention_dropout=0.1)
    dataset(root, 200)
    config = write_config(root, "reference.yaml", output_dir=str(root / "reference"), **KEYS)
    code, out = run("run", str(config), log=root / "reference.log")
    assert code == 0, out[-3000:]
    return root / "reference"


def assert_same_run(run_dir: Path, reference: Path) -> None:
    """Same losses (==), same final weights, same model, optimizer, scheduler and RNG at the last step."""
    assert read_metrics(run_dir) == read_metrics(reference)
    assert digest(run_dir / "final" / "model.safetensors") == digest(reference / "final" / "model.safetensors")
    last = "checkpoints/step-00000006"
    assert same_state(run_dir / last, reference / last)


def test_sigkill_at_five_points_then_resume_matches_the_uninterrupted_run(reference: Path) -> None:
    """(a, b) Killed five times, three of them inside the save window; each resume takes the newest committed
    checkpoint, never a partial one, and the run ends bit-equal to the uninterrupted one."""
    root = reference.parent
    config = write_config(root, "killed.yaml", output_dir=str(root / "killed"), **KEYS)
    out = root / "killed"
    kills = [  # fault, checkpoints left after it
        ("forward:3:0:sigkill", ["step-00000002"]),
        ("save-shards:4:0:sigkill", [".tmp-step-00000004", "step-00000002"]),
        ("save-after-commit:4:0:sigkill", ["step-00000002", "step-00000004"]),
        ("optimizer:5:0:sigkill", ["step-00000002", "step-00000004"]),
        ("save-before-commit:6:0:sigkill", [".tmp-step-00000006", "step-00000002", "step-00000004"]),
    ]
    for n, (fault, left) in enumerate(kills):
        newest = committed_checkpoints(out / "checkpoints")[-1] if n else None
        args = ("run", str(config), *(["--resume"] if n else []))
        code, log = run(*args, log=root / f"killed-{n}.log", env={"KTRAIN_FAULT": fault})
        assert code == -9, (fault, log[-2000:])
        assert newest is None or f"resumed from {newest} at step" in log, fault
        assert checkpoints(out) == left, fault
        assert all(verify(p) == [] for p in committed_checkpoints(out / "checkpoints")), fault
    code, log = run("run", str(config), "--resume", log=root / "killed-end.log")
    assert code == 0, log[-3000:]
    assert "resumed from" in log and "step-00000004 at step 4" in log
    assert_same_run(out, reference)


def test_disk_full_during_a_save_stops_the_run_and_the_previous_checkpoint_resumes(reference: Path) -> None:
    """(f) ENOSPC while writing step 4: the run stops saying so, step 2 is intact and resumes to the same end.
    ``save_total_limit: 1`` still keeps two complete checkpoints."""
    root = reference.parent
    config = write_config(root, "full.yaml", output_dir=str(root / "full"), save_total_limit=1, **KEYS)
    code, log = run("run", str(config), log=root / "full.log", env={"KTRAIN_FAULT": "save-shards:4:0:enospc"})
    assert code == 2 and "Traceback" not in log, log[-3000:]
    assert f"no space left on {root / 'full' / 'checkpoints'}: need " in log and ", have " in log
    assert checkpoints(root / "full") == ["step-00000002"]
    code, log = run("run", str(config), "--resume", log=root / "full-resume.log")
    assert code == 0, log[-3000:]
    assert "step-00000002 at step 2" in log
    assert_same_run(root / "full", reference)
    assert checkpoints(root / "full") == ["step-00000004", "step-00000006"]


def test_free_space_is_checked_before_a_save(tmp_path: Path) -> None:
    with pytest.raises(NoSpaceLeft, match=rf"^no space left on {tmp_path}: need 1073741824\.0 GiB, have "):
        ensure_space(tmp_path, 1 << 60)
    ensure_space(tmp_path, 1)


@pytest.mark.parametrize(
    ("damage", "file", "says"),
    [
        (flip_byte, "optimizer.pt", "does not match its sha256"),
        (truncate, "model.safetensors", "truncated or replaced"),
        (Path.unlink, "rank-0.pt", "is missing"),
        (flip_byte, "manifest.json", "not valid JSON"),
        (Path.unlink, "manifest.json", "is missing"),
    ],
)
def test_verify_names_the_damaged_file(reference: Path, tmp_path: Path, damage, file: str, says: str) -> None:
    """(g) A flipped byte, a truncated or missing file, a broken or missing manifest: named, before any read."""
    checkpoint = tmp_path / "step-00000002"
    shutil.copytree(reference / "checkpoints" / "step-00000002", checkpoint)
    assert verify(checkpoint) == []
    damage(checkpoint / file)
    (problem,) = verify(checkpoint)
    assert str(checkpoint / file) in problem and says in problem


def test_damaged_checkpoints_fall_back_then_stop_naming_the_files(reference: Path) -> None:
    """(g) Step 6 with a flipped byte and step 4 truncated: resume warns naming both files, takes step 2 and
    ends equal to the uninterrupted run (re-saving steps 4 and 6 whole). With every checkpoint damaged, the
    run stops naming each file, without a traceback."""
    root = reference.parent
    out = root / "damaged"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "final")
    config = write_config(root, "damaged.yaml", output_dir=str(out), **KEYS)
    flip_byte(out / "checkpoints" / "step-00000006" / "optimizer.pt")
    truncate(out / "checkpoints" / "step-00000004" / "model.safetensors")
    code, log = run("run", str(config), "--resume", log=root / "damaged.log")
    assert code == 0, log[-3000:]
    assert f"warning: checkpoint step-00000006 is damaged: {out}/checkpoints/step-00000006/optimizer.pt" in log
    assert f"warning: checkpoint step-00000004 is damaged: {out}/checkpoints/step-00000004/model.safetensors" in log
    assert "step-00000002 at step 2" in log
    assert_same_run(out, reference)
    assert all(verify(p) == [] for p in committed_checkpoints(out / "checkpoints"))

    flip_byte(out / "checkpoints" / "step-00000006" / "model.safetensors")
    (out / "checkpoints" / "step-00000004" / "scheduler.pt").unlink()
    (out / "checkpoints" / "step-00000002" / "manifest.json").write_text("{}")
    code, log = run("run", str(config), "--resume", log=root / "damaged-all.log")
    assert code == 2 and "Traceback" not in log, log[-3000:]
    assert "no intact checkpoint is left" in log
    for file in ("step-00000006/model.safetensors", "step-00000004/scheduler.pt", "step-00000002/manifest.json"):
        assert f"{out}/checkpoints/{file}" in log, file
