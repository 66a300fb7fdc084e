"""DPO on 2 CPU ranks: DDP, FSDP1, FSDP2 and ZeRO-3 give the losses of one process (global batch 8 as 1 rank x 2
micro-batches of 4, and as 2 ranks x 1); under FSDP2 and ZeRO-3 the frozen reference is sharded like the policy,
each rank holding half of it (under FSDP2's loading on rank 0 alone too; FSDP1 keeps it whole), and a DDP run
killed mid-step resumes from its checkpoint and continues exactly. The DDP run precomputes its reference
log-probabilities (precompute_ref_log_probs), holding no reference model: its losses are those of the one process's
live reference, and the resumed run reads them back. Every run computes a pair's prompt once for both answers
(ktrain_preference.layout)."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from ktrain.config.plan import prepare
from ktrain.memory.model import predict
from ktrain.testing import ktrain, model_dir, read_metrics, write_config

STEPS = 4


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with weights, 16 pairs, and the one-process run every layout is compared with."""
    path = tmp_path_factory.mktemp("dpo-ranks")
    model_dir(path, weights=True)
    rng = random.Random(2)
    rows = []
    for _ in range(16):
        a, b = rng.randint(10, 99), rng.randint(10, 99)
        rows.append({"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + rng.randint(1, 9))})
    (path / "pairs.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    done = ktrain("run", str(_config(path, "one", gradient_accumulation_steps=2)))
    assert done.returncode == 0, done.stderr[-3000:]
    return path


def _config(root: Path, name: str, **keys: object) -> Path:
    return write_config(
        root,
        f"{name}.yaml",
        random_init_weights=False,
        rl="dpo",
        datasets=[{"path": str(root / "pairs.jsonl"), "type": "chat_template.default"}],
        max_steps=STEPS,
        learning_rate=1e-3,
        output_dir=str(root / name),
        **keys,
    )


def _halves(stdout: str) -> int:
    """Each of the 2 ranks holds half of the reference's parameters (as each rank measured them); returns rank 0's."""
    pattern = r"reference is sharded like the policy: the ranks hold ([\d,]+), ([\d,]+) of its ([\d,]+)"
    found = re.search(pattern, stdout)
    assert found, stdout[-3000:]
    first, second, total = (int(v.replace(",", "")) for v in found.groups())
    for mine in (first, second):
        assert mine == pytest.approx(total / 2, rel=0.02), (first, second, total)
    return first


def _predicted_reference(config: Path) -> int:
    """``ktrain plan``'s bytes of the reference on rank 0 of 2: what its copy adds to the predicted parameters."""
    plans = [prepare(config, sets, world_size=2) for sets in ([], ["precompute_ref_log_probs=true"])]
    with_copy, without = (predict(p.config, p.mesh, p.plugins).states.parameters for p in plans)
    return with_copy - without


def _same_losses(root: Path, name: str) -> None:
    one, other = read_metrics(root / "one"), read_metrics(root / name)
    assert one.keys() == other.keys() == set(range(1, STEPS + 1))
    for step in one:  # fp32; only the order of the sums differs
        assert other[step] == pytest.approx(one[step], rel=1e-5), (name, step)


def test_fsdp2_two_ranks_match_one_process(root: Path) -> None:
    config = _config(root, "fsdp2", fsdp_version=2)
    done = ktrain("run", str(config), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert _predicted_reference(config) == 4 * _halves(done.stdout)  # fp32
    _same_losses(root, "fsdp2")


def test_fsdp2_loading_on_rank_0_fills_the_sharded_reference(root: Path) -> None:
    """Under cpu_ram_efficient_loading the other ranks' copy is empty (meta): rank 0's fills its shards."""
    config = _config(root, "fsdp2-rank0", fsdp_version=2, fsdp_config={"cpu_ram_efficient_loading": True})
    done = ktrain("run", str(config), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    _halves(done.stdout)
    _same_losses(root, "fsdp2-rank0")


def test_fsdp1_loading_on_rank_0_gives_every_rank_the_whole_reference(root: Path) -> None:
    """FSDP1 keeps the reference whole; under its loading on rank 0 alone, rank 0's copy goes to every rank."""
    config = _config(root, "fsdp1-rank0", fsdp_version=1, fsdp_config={"fsdp_cpu_ram_efficient_loading": True})
    done = ktrain("run", str(config), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the reference is whole on every rank: the ranks hold 86,848, 86,848 of its 86,848" in done.stdout
    assert _predicted_reference(config) == 4 * 86_848
    _same_losses(root, "fsdp1-rank0")


def test_zero3_two_ranks_with_a_frozen_reference_match_one_process(root: Path) -> None:
    config = _config(root, "zero3", deepspeed="zero3")
    done = ktrain("run", str(config), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "the reference is a frozen copy of the model as loaded" in done.stdout
    # DeepSpeed keeps its weights below the persistence threshold (the norms: 320 of 43,744 here) whole
    assert _predicted_reference(config) == pytest.approx(4 * _halves(done.stdout), rel=0.01)
    _same_losses(root, "zero3")


def test_ddp_two_ranks_with_precomputed_reference_match_one_process_and_resume_exactly_after_a_kill(
    root: Path,
) -> None:
    config = _config(root, "ddp", save_steps=2, precompute_ref_log_probs=True)
    killed = ktrain("run", str(config), "--nproc-per-node", "2", env={"KTRAIN_FAULT": "forward:4:*:sigkill"})
    assert killed.returncode != 0
    assert "the reference is precomputed before training (no reference model)" in killed.stdout
    assert "frozen copy" not in killed.stdout and "log-probabilities of 16 samples into" in killed.stdout
    assert "a pair's prompt is computed once for both answers" in killed.stdout
    before = read_metrics(root / "ddp")
    assert sorted(before) == [1, 2, 3]  # step 3 logged, not checkpointed: it runs again after the resume
    resumed = ktrain("run", str(config), "--nproc-per-node", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "the reference's log-probabilities read from" in resumed.stdout
    after = read_metrics(root / "ddp")
    assert after[3] == before[3]  # the step after the checkpoint, run twice: the same loss to the bit
    assert read_metrics(root / "ddp", "rewards/margins")[3] != 0.0
    _same_losses(root, "ddp")
