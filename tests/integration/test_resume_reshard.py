"""A run stopped on one number of ranks resumes on another (a job requeued onto fewer or more nodes), on CPU
ranks (gloo), for each sharding: DDP 4 -> 2, FSDP2 2 -> 4 (DCP reshards), ZeRO-3 4 -> 2 (ktrain cuts the new
partitions out of the saved ones).

Every run trains the tiny Llama (hidden size 42, so that 4 ranks' partitions of a norm are padded; saved seeded
weights, so ZeRO-3 starts from the same ones) for 4 steps of one global batch of 8 rows (micro-batches of 2),
with warm-up, a cosine schedule and weight decay. The uninterrupted run is DDP on 4 ranks. A run to resume
stops after the checkpoint of step 2 (cut back, or stopped at step 3's forward by ``KTRAIN_FAULT``); the same
config is resumed on the other number of ranks, where the launcher sets the accumulation that keeps 8 rows.
Every step's loss equals the uninterrupted run's within the relative 1e-5 of the kernel's parity tests (fp32:
only the order of the gradient sums differs).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records
from tests.kit import REPO

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5
ROWS, MICRO, STEPS = 8, 2, 4
KEYS = dict(
    random_init_weights=False,
    micro_batch_size=MICRO,
    max_steps=STEPS,
    save_steps=2,
    warmup_steps=1,
    lr_scheduler="cosine",
    weight_decay=0.1,
)
STOP_AFTER_STEP_2 = {"KTRAIN_FAULT": "forward:3:*:exit"}


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, float]]:
    """The tiny model and data, and the uninterrupted run every resumed one is compared with: DDP on 4 ranks
    (micro-batches of 2, no accumulation), saving at steps 2 and 4; its folder and losses."""
    root = tmp_path_factory.mktemp("reshard")
    model_dir(root, weights=True, hidden_size=42, num_attention_heads=2, num_key_value_heads=1)  # padded shards
    dataset(root, 100)
    config = write_config(root, "ddp.yaml", output_dir=str(root / "ddp"), gradient_accumulation_steps=1, **KEYS)
    done = ktrain("run", str(config), "--nproc-per-node", "4")
    assert done.returncode == 0, done.stderr[-3000:]
    return root, records(root / "ddp")


def stop_then_resume(root: Path, name: str, before: int, after: int, **keys: object) -> tuple[Path, str]:
    """Train ``name`` on ``before`` ranks until it stops after the checkpoint of step 2, resume it on ``after``;
    return the run directory and the resumed run's output."""
    accumulation = ROWS // (MICRO * before)
    config = write_config(
        root, f"{name}.yaml", output_dir=str(root / name), gradient_accumulation_steps=accumulation, **KEYS, **keys
    )
    first = ktrain("run", str(config), "--nproc-per-node", str(before), env=STOP_AFTER_STEP_2)
    assert first.returncode == 1, first.stderr[-3000:]
    assert sorted(p.name for p in (root / name / "checkpoints").glob("step-*")) == ["step-00000002"]
    resumed = ktrain("run", str(config), "--resume", "--nproc-per-node", str(after))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed(resumed.stdout, before, after)
    return root / name, resumed.stdout


def assert_resumed(out: str, before: int, after: int) -> None:
    """``out`` says the launcher set the accumulation that keeps 8 rows, and the ranks resumed at step 2."""
    was, kept = ROWS // (MICRO * before), ROWS // (MICRO * after)
    assert (
        f"resuming step-00000002 on {after} data-parallel ranks instead of {before}: gradient_accumulation_steps "
        f"{was} -> {kept} keeps its global batch of {ROWS} rows" in out
    )
    assert "at step 2" in out and f"= {after} ranks" in out


def assert_parity(reference: dict[int, float], losses: dict[int, float]) -> None:
    assert losses.keys() == reference.keys() == set(range(1, STEPS + 1))
    for step, loss in reference.items():
        assert losses[step] == pytest.approx(loss, rel=TOLERANCE), (step, losses, reference)


def test_ddp_four_ranks_resume_on_two_and_a_batch_three_cannot_make_is_refused(reference: tuple) -> None:
    """DDP (the kernel's full-state checkpoint): the reference cut back to its step-2 checkpoint resumes on 2
    ranks; on 3, whose micro-batches of 2 cannot make 8 rows, the resume is refused before any rank starts
    (one line, exit 2) and the run directory is left as it was."""
    root, losses = reference
    run = root / "ddp-on-two"
    shutil.copytree(root / "ddp", run)
    shutil.rmtree(run / "checkpoints" / "step-00000004")
    shutil.rmtree(run / "final")
    (run / "metrics.jsonl").write_text("".join((run / "metrics.jsonl").read_text().splitlines(True)[:2]))
    config = write_config(root, "ddp-on-two.yaml", output_dir=str(run), gradient_accumulation_steps=1, **KEYS)
    resumed = ktrain("run", str(config), "--resume", "--nproc-per-node", "2")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert_resumed(resumed.stdout, 4, 2)
    assert_parity(losses, records(run))

    files = {p: p.read_bytes() for p in run.rglob("*") if p.is_file()}
    refused = ktrain("run", str(config), "--resume", "--nproc-per-node", "3")
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    assert (
        f"--resume: {run / 'checkpoints' / 'step-00000004'} was trained with a global batch of 8 rows a "
        "step on 2 data-parallel ranks; 3 data-parallel ranks of micro_batch_size 2 cannot make 8 rows by gradient "
        "accumulation. Resume on a number of data-parallel ranks that divides 4"
    ) in refused.stderr
    assert "data:" not in refused.stdout  # no rank started
    assert {p: p.read_bytes() for p in run.rglob("*") if p.is_file()} == files


def test_fsdp2_two_ranks_resume_on_four(reference: tuple) -> None:
    """FSDP2 (DCP) 2 -> 4: the shards of two ranks read as four."""
    pytest.importorskip("ktrain_fsdp")
    root, losses = reference
    run, out = stop_then_resume(root, "fsdp2", 2, 4, fsdp_version=2)
    assert "dp_shard 4" in out
    assert_parity(losses, records(run))


def test_zero3_four_ranks_resume_on_two(reference: tuple) -> None:
    """DeepSpeed ZeRO-3 4 -> 2: each rank of two cuts its partitions out of the four saved ones."""
    pytest.importorskip("ktrain_deepspeed")
    root, losses = reference
    zero3 = str(REPO / "tests" / "fixtures" / "deepspeed" / "zero3.json")
    run, out = stop_then_resume(root, "zero3", 4, 2, deepspeed=zero3)
    assert "dp_shard 2" in out
    assert_parity(losses, records(run))
