"""FSDP training for real on CPU (gloo): loss parity with one process, exact resume, resharding, export.

Every run trains the tiny Llama of tests/kit.py for 6 steps of one global batch of 8 rows, split as
1 process x 4 micro-batches of 2 (the reference), or over 2 or 4 ranks. Parity is stated as a
relative tolerance of 1e-5 on each step's loss in fp32: only the order of the gradient sums differs
(measured differences are below 1e-7).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model and data, and the one-process reference run (global batch 8 = 4 micro-batches of 2)."""
    path = tmp_path_factory.mktemp("fsdp")
    model_dir(path)
    dataset(path, 200)
    reference = write_config(
        path, "one.yaml", micro_batch_size=2, gradient_accumulation_steps=4, output_dir=str(path / "one")
    )
    done = ktrain("run", str(reference))
    assert done.returncode == 0, done.stderr
    return path


def train(root: Path, name: str, ranks: int, *args: str, **keys: object) -> Path:
    """Run ``keys`` on ``ranks`` ranks with global batch 8 (micro-batches of 2); return the run folder."""
    keys.setdefault("gradient_accumulation_steps", 4 // ranks)
    config = write_config(root, f"{name}.yaml", micro_batch_size=2, output_dir=str(root / name), **keys)
    done = ktrain("run", str(config), "--nproc-per-node", str(ranks), *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / name


def assert_parity(reference: dict[int, float], losses: dict[int, float]) -> None:
    assert losses.keys() == reference.keys() == set(range(1, 7))
    for step, loss in reference.items():
        assert losses[step] == pytest.approx(loss, rel=TOLERANCE), (step, losses, reference)


def same_weights(a: Path, b: Path) -> bool:
    x, y = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def truncate_to(run: Path, keep_step: int) -> None:
    """Make ``run`` look killed after checkpoint ``keep_step``: later checkpoints, final and records gone."""
    for checkpoint in (run / "checkpoints").iterdir():
        if int(checkpoint.name.split("-")[-1]) > keep_step:
            shutil.rmtree(checkpoint)
    shutil.rmtree(run / "final")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join(lines[:keep_step]) + "\n")


def resume_matches(root: Path, run: Path, ranks: int) -> None:
    """Resuming ``run`` from its step-3 checkpoint gives the same losses and final weights as the whole run."""
    one_go = root / f"{run.name}-one-go"
    shutil.copytree(run, one_go)
    truncate_to(run, 3)
    resumed = ktrain("run", str(root / f"{run.name}.yaml"), "--nproc-per-node", str(ranks), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout
    assert records(run) == records(one_go)
    assert same_weights(run / "final", one_go / "final")


def test_fsdp2_two_ranks_matches_one_process_resumes_exactly_and_exports(root: Path) -> None:
    """FSDP2 at 2 ranks (with activation checkpointing): parity; resume from step 3 is bit-exact; export merges."""
    run = train(root, "fsdp2", 2, fsdp_version=2, save_steps=3, fsdp_config={"activation_checkpointing": True})
    assert_parity(records(root / "one"), records(run))
    manifest = (run / "checkpoints" / "step-00000003" / "manifest.json").read_text()
    assert '"format": "ktrain-dcp"' in manifest and '"state_dict_type": "SHARDED_STATE_DICT"' in manifest
    exported = ktrain("export", str(run))  # the DCP shards of step 6, merged on one process
    assert exported.returncode == 0, exported.stderr
    assert same_weights(run / "final", run / "export-step-00000006")
    model = transformers.AutoModelForCausalLM.from_pretrained(run / "export-step-00000006")
    assert model(input_ids=torch.tensor([[1, 2, 3]])).logits.shape[-1] == model.config.vocab_size
    resume_matches(root, run, 2)


def test_fp32_master_optimizer_under_fsdp2_learns_and_resumes_exactly(root: Path) -> None:
    """``bfloat16`` + ``optimizer: adamw_fp32_master`` at 2 ranks: the masters are sharded like the weights,
    the DCP checkpoint holds them in fp32, and the resume from step 3 is bit-exact."""
    run = train(root, "fsdp2-master", 2, fsdp_version=2, save_steps=3, bfloat16=True, optimizer="adamw_fp32_master")
    losses = records(run)
    assert losses[6] < losses[1], losses
    resume_matches(root, run, 2)


def test_fsdp2_four_ranks_matches_and_resumes_on_two(root: Path) -> None:
    """FSDP2 at 4 ranks: parity; its step-3 checkpoint resumed at 2 ranks (resharded) continues with the same losses."""
    run = train(root, "fsdp2x4", 4, fsdp_version=2, save_steps=3)
    four = records(run)
    assert_parity(records(root / "one"), four)
    truncate_to(run, 3)
    config = write_config(
        root, "fsdp2x4.yaml", micro_batch_size=2, gradient_accumulation_steps=2, output_dir=str(run), fsdp_version=2
    )
    resumed = ktrain("run", str(config), "--nproc-per-node", "2", "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resumed from" in resumed.stdout and "dp_shard 2" in resumed.stdout
    after = records(run)
    assert {s: after[s] for s in (1, 2, 3)} == {s: four[s] for s in (1, 2, 3)}
    for step in (4, 5, 6):
        assert after[step] == pytest.approx(four[step], rel=TOLERANCE), (step, after, four)


def test_hsdp_two_by_two_matches_one_process_and_resumes(root: Path) -> None:
    """HSDP: 2 replicas x 2 shards, with cpu_ram_efficient_loading and FULL_STATE_DICT checkpoints."""
    keys = {"cpu_ram_efficient_loading": True, "state_dict_type": "FULL_STATE_DICT"}
    run = train(root, "hsdp", 4, fsdp_version=2, dp_replicate_size=2, dp_shard_size=2, save_steps=3, fsdp_config=keys)
    assert_parity(records(root / "one"), records(run))
    checkpoint = run / "checkpoints" / "step-00000006"
    assert (checkpoint / "model.safetensors").is_file()
    assert same_weights(run / "final", checkpoint)
    resume_matches(root, run, 4)


@pytest.mark.parametrize("strategy", ["FULL_SHARD", "SHARD_GRAD_OP"])
def test_fsdp1_matches_one_process(root: Path, strategy: str) -> None:
    """FSDP1 at 2 ranks. FULL_SHARD: FULL_STATE_DICT checkpoints; SHARD_GRAD_OP: rank 0 alone loads the
    weights (cpu_ram_efficient_loading), and resuming its sharded step-3 checkpoint is exact."""
    keys = {
        "fsdp_sharding_strategy": strategy,
        "fsdp_cpu_ram_efficient_loading": strategy == "SHARD_GRAD_OP",
        "fsdp_state_dict_type": "FULL_STATE_DICT" if strategy == "FULL_SHARD" else "SHARDED_STATE_DICT",
    }
    run = train(root, f"fsdp1-{strategy}", 2, fsdp_version=1, save_steps=3, fsdp_config=keys)
    assert_parity(records(root / "one"), records(run))
    exported = ktrain("export", str(run))
    assert exported.returncode == 0, exported.stderr
    assert same_weights(run / "final", run / "export-step-00000006")
    if strategy == "SHARD_GRAD_OP":
        resume_matches(root, run, 2)


AXOLOTL_FSDP2 = Path(__file__).resolve().parent / "fixtures" / "axolotl_fsdp2.yaml"


@pytest.mark.parametrize("config", [AXOLOTL_FSDP2], ids=lambda p: p.name)
def test_seed_config_trains(root: Path, config: Path) -> None:
    """An Axolotl-style FSDP2 config with a tiny local model and dataset: bf16 mixed precision, 2 ranks, 2 steps
    (fsdp_version and sharding_strategy: FULL_SHARD inside fsdp_config). The seed files fsdp1.yaml and fsdp2.yaml
    train the same way in tests/integration/test_seed_configs.py."""
    out = root / f"seed-{config.name}"
    overrides = {
        "base_model": root / "model",
        "random_init_weights": "true",
        "datasets": f"[{{path: {root / 'train.jsonl'}, type: chat_template}}]",
        "output_dir": out,
        "sequence_len": 64,
        "max_steps": 2,
    }
    sets = [arg for key, value in overrides.items() for arg in ("--set", f"{key}={value}")]
    done = ktrain("run", str(config), "--nproc-per-node", "2", *sets)
    assert done.returncode == 0, done.stderr[-3000:]
    losses = records(out)
    assert sorted(losses) == [1, 2] and all(0 < loss < 10 for loss in losses.values())
    assert (out / "final" / "model.safetensors").is_file()


def test_one_process_fsdp2_with_offload_and_size_based_units_matches(root: Path) -> None:
    """One rank (a process group of one): CPU offload policy and units chosen by size; same losses."""
    keys = {"offload_params": True, "auto_wrap_policy": "SIZE_BASED_WRAP", "min_num_params": 20000}
    run = train(root, "fsdp2x1", 1, fsdp_version=2, fsdp_config=keys)
    assert_parity(records(root / "one"), records(run))


@pytest.mark.parametrize("shards", [1, 2])
def test_fsdp1_hybrid_shard_matches_one_process(root: Path, shards: int) -> None:
    """FSDP1 HYBRID_SHARD over 2 replicas of ``shards`` ranks (the run's 2-D mesh)."""
    keys = {"fsdp_sharding_strategy": "HYBRID_SHARD"}
    run = train(root, f"fsdp1-hybrid{shards}", 2 * shards, fsdp_version=1, dp_replicate_size=2, fsdp_config=keys)
    assert_parity(records(root / "one"), records(run))
