"""Configs users copy from Axolotl guides (tests/fixtures/seed/) train for real, on CPU at 2 ranks.

Each file is run as written, but for what a CPU test must change: the model (a tiny Llama or Qwen3 with
saved weights), the data (chat rows), the steps (2), the sequence length (64, the tiny model's limit) and
the mesh sizes (2 ranks). liger.yaml needs a GPU: on a CPU it is refused before any rank starts. The two files
written for 8 GPUs hold the keys of configs/hsdp_tp.yaml and configs/qwen3_fsdp_tp_cp.yaml, which
test_multi_gpu_parity.py trains on 8 CPU ranks against one rank.
"""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import transformers
import yaml

from ktrain.testing import dataset, ktrain, model_dir, read_metrics
from tests.kit import REPO

SEED = REPO / "tests" / "fixtures" / "seed"
MESHES = {  # config: the mesh sizes of a 2-rank run (the rest of the ranks the file names are not here)
    "fsdp1": {},
    "fsdp2": {},
    "fsdp_qlora": {},
    "oom_rescue": {},
    "zero3": {},
}
EIGHT_GPUS = ("hsdp_tp", "qwen3_fsdp_tp_cp")  # trained on 8 ranks as configs/NAME.yaml
PLUGINS = {"fsdp": "ktrain_fsdp", "qlora": "ktrain_lora", "tp": "ktrain_parallel", "zero3": "ktrain_deepspeed"}


def test_every_config_is_a_case() -> None:
    """Every fixture is trained below, refused (liger.yaml), or is a config of configs/ trained on 8 ranks."""
    assert {p.stem for p in SEED.glob("*.yaml")} == {name.split("-")[0] for name in MESHES} | {"liger", *EIGHT_GPUS}


@pytest.mark.parametrize("name", EIGHT_GPUS)
def test_the_8_gpu_fixtures_are_the_configs_trained_on_8_ranks(name: str) -> None:
    """The fixture and configs/NAME.yaml write the same keys and values (but where the run is written)."""
    fixture, config = (
        yaml.safe_load(path.read_text()) for path in (SEED / f"{name}.yaml", REPO / "configs" / f"{name}.yaml")
    )
    assert fixture.pop("output_dir") and config.pop("output_dir")
    assert fixture == config


def _saved_model(folder: Path, **overrides: object) -> Path:
    """The tiny model of tests/kit.py with seeded random weights saved (QLoRA quantizes saved weights)."""
    path = model_dir(folder, **overrides)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path)).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama, a tiny Qwen3 (both with weights) and 64 chat rows."""
    path = tmp_path_factory.mktemp("seed")
    _saved_model(path)
    _saved_model(path / "qwen3", model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    dataset(path, 64)
    return path


def _sets(root: Path, name: str) -> list[str]:
    """``--set`` arguments: the model, the data, 2 steps, sequence length 64, and the mesh of 2 ranks."""
    model = root / "qwen3" / "model" if name.startswith("qwen3") else root / "model"
    pairs = {
        "base_model": model,
        "datasets": f"[{{path: {root / 'train.jsonl'}, type: chat_template}}]",
        "max_steps": 2,
        "sequence_len": 64,
        **MESHES.get(name, {}),
    }
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


def _needs(name: str) -> None:
    for word, module in PLUGINS.items():
        if word in name and importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MESHES))
def test_config_trains_on_two_ranks(name: str, root: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _needs(name)
    monkeypatch.chdir(tmp_path)  # output_dir: ./outputs/..., deepspeed: deepspeed_configs/... are relative
    config = SEED / f"{name.split('-')[0]}.yaml"
    if "deepspeed:" in config.read_text():  # the JSON files Axolotl users fetch first
        assert ktrain("fetch", "deepspeed_configs").returncode == 0
    done = ktrain("run", str(config), *_sets(root, name), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    out = tmp_path / "outputs" / config.stem
    losses = read_metrics(out)
    assert max(losses) == 2 and all(math.isfinite(v) and 0 < v < 10 for v in losses.values()), losses
    assert (out / "final").is_dir()
    if name == "zero3":  # flash attention asked for, SDPA on a CPU; logging_steps 10: the last step is always logged
        assert "flash-attn is not installed (or there is no GPU); using PyTorch SDPA" in done.stderr
        assert losses.keys() == {2}


def test_liger_is_refused_on_a_cpu_before_any_rank_starts(root: Path, tmp_path: Path, monkeypatch) -> None:
    """Liger's kernels are Triton (GPU): on a CPU, one line that says so, exit 2, and no run directory."""
    pytest.importorskip("ktrain_liger")
    monkeypatch.chdir(tmp_path)
    done = ktrain("run", str(SEED / "liger.yaml"), *_sets(root, "liger"), "--nproc-per-node", "2")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    problems = [line for line in done.stderr.splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and "liger" in problems[0].lower(), done.stderr
    assert not (tmp_path / "outputs").exists()
