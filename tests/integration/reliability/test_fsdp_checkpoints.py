"""The battery on FSDP2's DCP checkpoints (``ktrain-dcp``), two ranks on gloo: a rank killed inside the save,
a full disk, resuming twice; resharding 2 -> 1 rank past a ``.metadata`` replaced by a pickle that would run
code; layouts that cannot resume, refused. Global batch 8 rows (2 ranks x 2 rows x 2 micro-batches, or 1 x 2
x 4); no dropout, so one rank and two draw the same numbers."""

from __future__ import annotations

import contextlib
import pickle
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ktrain.run.checkpoints import committed_checkpoints, verify
from ktrain.testing import dataset, model_dir, read_metrics, write_config
from tests.integration.reliability.kit import KEYS, checkpoints, digest, malicious_pickle, run, same_state

pytest.importorskip("ktrain_fsdp")
pytestmark = pytest.mark.slow
TWO = ("--nproc-per-node", "2")
FSDP = {**KEYS, "fsdp_version": 2, "micro_batch_size": 2}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fsdp")
    model_dir(root)
    dataset(root, 200)
    config = write_config(root, "reference.yaml", output_dir=str(root / "reference"), **FSDP)
    code, out = run("run", str(config), *TWO, log=root / "reference.log")
    assert code == 0, out[-3000:]
    return root / "reference"


def test_killed_in_a_save_then_disk_full_then_resumed_matches(reference: Path) -> None:
    """(a, f, b) Rank 1 killed while the DCP shards of step 4 are written: step 2 is what is left. Resumed, the
    disk fills during the save of step 6 on rank 0: every rank exits saying so, step 4 stays whole. Resumed
    again, the run ends with the losses, weights and DCP shards of the uninterrupted run."""
    root = reference.parent
    out = root / "killed"
    config = write_config(root, "killed.yaml", output_dir=str(out), **FSDP)
    code, log = run("run", str(config), *TWO, log=root / "killed.log", env={"KTRAIN_FAULT": "save-shards:4:1:sigkill"})
    assert code == 1 and "rank 1 failed (exit code -9)" in log, log[-3000:]
    assert checkpoints(out) == [".tmp-step-00000004", "step-00000002"]
    full = {"KTRAIN_FAULT": "save-shards:6:0:enospc"}
    code, log = run("run", str(config), "--resume", *TWO, log=root / "full.log", env=full)
    assert code == 2 and "Traceback" not in log and f"no space left on {out / 'checkpoints'}: need " in log, log[-3000:]
    assert [name for name in checkpoints(out) if name.startswith("step-")] == ["step-00000002", "step-00000004"]
    assert all(verify(p) == [] for p in committed_checkpoints(out / "checkpoints"))
    code, log = run("run", str(config), "--resume", *TWO, log=root / "resumed.log")
    assert code == 0, log[-3000:]
    assert "step-00000004 at step 4" in log
    assert read_metrics(out) == read_metrics(reference)
    assert digest(out / "final" / "model.safetensors") == digest(reference / "final" / "model.safetensors")
    assert same_state(out / "checkpoints" / "step-00000006", reference / "checkpoints" / "step-00000006")


def test_the_malicious_pickle_is_live(reference: Path, tmp_path: Path) -> None:
    """The payload of the next test runs when unpickled, and DCP unpickles ``.metadata``: only the hash check
    stands between them."""
    import torch.distributed.checkpoint as dcp

    marker = tmp_path / "ran"
    pickle.loads(malicious_pickle(marker))
    assert marker.exists()
    marker.unlink()
    folder = tmp_path / "dcp"
    shutil.copytree(reference / "checkpoints" / "step-00000002" / "dcp", folder)
    (folder / ".metadata").write_bytes(malicious_pickle(marker, size=(folder / ".metadata").stat().st_size))
    with contextlib.suppress(Exception):  # the payload's result is no Metadata; what matters is that it ran
        dcp.FileSystemReader(folder).read_metadata()
    assert marker.exists()


def test_reshard_two_to_one_past_a_malicious_metadata(reference: Path, tmp_path: Path) -> None:
    """(c, g) Step 6's ``.metadata`` is a pickle that would create a file. Resume and export name it and never
    run it; one rank resumes step 4 of two (resharded), keeps the data position (global sample 32) and ends
    with the two-rank run's losses and weights. A change of global batch, and a plain one-process run, are
    refused with a message."""
    root = reference.parent
    out = root / "reshard"
    shutil.copytree(reference, out)
    shutil.rmtree(out / "final")
    marker = tmp_path / "ran"
    metadata = out / "checkpoints" / "step-00000006" / "dcp" / ".metadata"
    metadata.write_bytes(malicious_pickle(marker, size=metadata.stat().st_size))

    code, log = run("export", str(out), "--checkpoint", str(metadata.parents[1]), log=root / "export.log")
    assert code == 2 and f"{metadata} does not match its sha256" in log, log[-3000:]

    smaller = write_config(root, "smaller.yaml", output_dir=str(out), **{**FSDP, "gradient_accumulation_steps": 1})
    code, log = run("run", str(smaller), "--resume", *TWO, log=root / "smaller.log")
    assert code == 2 and "Traceback" not in log, log[-3000:]
    assert "gradient_accumulation_steps: 1 here makes 4 rows a step" in log

    plain = write_config(root, "plain.yaml", output_dir=str(out), **{**KEYS, "micro_batch_size": 2, "max_steps": 6})
    code, log = run("run", str(plain), "--resume", "--set", "gradient_accumulation_steps=4", log=root / "plain.log")
    assert code != 0 and "is a 'ktrain-dcp' checkpoint written by fsdp" in log, log[-3000:]

    one = write_config(root, "one.yaml", output_dir=str(out), **{**FSDP, "gradient_accumulation_steps": 4})
    code, log = run("run", str(one), "--resume", log=root / "one.log")
    assert code == 0, log[-3000:]
    assert f"warning: checkpoint step-00000006 is damaged: {metadata} does not match its sha256" in log
    assert "step-00000004 at step 4" in log and "dp_shard 1" in log
    assert not marker.exists()
    want, got = read_metrics(reference), read_metrics(out)
    assert got.keys() == want.keys() and all(got[s] == want[s] for s in (1, 2, 3, 4))
    assert all(got[s] == pytest.approx(want[s], rel=1e-5) for s in (5, 6))  # sums in another order
    a, b = load_file(out / "final" / "model.safetensors"), load_file(reference / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], rtol=1e-4, atol=1e-6) for k in a)
    assert verify(metadata.parents[1]) == []  # step 6 saved again, whole, by renames
