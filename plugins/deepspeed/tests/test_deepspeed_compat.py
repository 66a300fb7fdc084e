"""The files users bring, trained on CPU at 2 ranks: Axolotl's bf16 ZeRO-3 JSON files, and the
Axolotl-style run configs zero3.yaml and oom_rescue.yaml scaled down to the tiny model (their JSON fetched with
``ktrain fetch deepspeed_configs``, as an Axolotl user does)."""

from __future__ import annotations

import importlib.util
import math
from pathlib import Path

import pytest
import torch
import transformers
import yaml
from safetensors.torch import load_file

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records
from tests.kit import REPO

FIXTURES = REPO / "tests" / "fixtures"
BF16_FILES = ["zero3_bf16.json", "zero3_bf16_cpuoffload_params.json", "zero3_bf16_cpuoffload_all.json"]


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny model with saved weights (QLoRA cannot quantize ZeRO-3's random init) and 120 chat rows."""
    root = tmp_path_factory.mktemp("deepspeed-compat")
    path = model_dir(root)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(path)).save_pretrained(path)
    dataset(root, 120)
    return root


@pytest.mark.parametrize("name", BF16_FILES)
def test_reference_bf16_json_trains(root: Path, name: str, tmp_path: Path) -> None:
    """bf16 ZeRO-3, with parameters and optimizer offloaded to CPU or not; the final model is the 16-bit gather
    (gather_16bit_weights_on_model_save), equal to the fp32 export of the same step rounded to bf16."""
    out = tmp_path / "out"
    deepspeed = str(FIXTURES / "deepspeed" / name)
    keys = dict(random_init_weights=False, bf16=True, max_steps=2, micro_batch_size=2, save_steps=2)
    config = write_config(root, f"{name}.yaml", deepspeed=deepspeed, output_dir=str(out), **keys)
    done = ktrain("run", str(config), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    losses = records(out)
    assert losses.keys() == {1, 2} and all(math.isfinite(v) for v in losses.values())
    final = load_file(out / "final" / "model.safetensors")
    assert {t.dtype for t in final.values()} == {torch.bfloat16}
    if name == "zero3_bf16_cpuoffload_all.json":
        exported = ktrain("export", str(out))
        assert exported.returncode == 0, exported.stderr[-3000:]
        fp32 = load_file(out / "export-step-00000002" / "model.safetensors")
        assert {t.dtype for t in fp32.values()} == {torch.float32} and fp32.keys() == final.keys()
        assert all(torch.equal(final[k], fp32[k].to(torch.bfloat16)) for k in final)


def _scaled(seed: str, root: Path, out: Path) -> list[str]:
    """``--set`` overrides that point an Axolotl-style config at the tiny model and data, for 2 steps."""
    return [
        "--set", f"base_model={root / 'model'}",
        "--set", f"datasets=[{{path: {root / 'train.jsonl'}, type: chat_template}}]",
        "--set", f"output_dir={out}",
        "--set", "sequence_len=64",
        "--set", "max_steps=2",
    ]  # fmt: skip


def test_seed_zero3_runs(root: Path, tmp_path: Path, monkeypatch) -> None:
    """bf16, accumulation 4, gradient checkpointing, packing, fused AdamW, flash attention (SDPA on CPU)."""
    monkeypatch.chdir(tmp_path)  # the seed names deepspeed_configs/zero3_bf16.json, relative to here
    assert ktrain("fetch", "deepspeed_configs").returncode == 0
    seed = FIXTURES / "seed" / "zero3.yaml"
    done = ktrain("run", str(seed), *_scaled("zero3", root, tmp_path / "out"), "--set", "micro_batch_size=1",
                  "--nproc-per-node", "2")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "flash-attn is not installed (or there is no GPU); using PyTorch SDPA" in done.stderr
    assert records(tmp_path / "out").keys() == {2}  # logging_steps: 10; the last step is always logged


def test_seed_oom_rescue_runs(root: Path, tmp_path: Path, monkeypatch) -> None:
    """ZeRO-3 with parameters offloaded to CPU, micro-batch 1, accumulation 8, bf16, and 4-bit QLoRA when
    ktrain-plugin-lora is installed (without it, this plugin's side alone: the same config less the QLoRA keys)."""
    monkeypatch.chdir(tmp_path)
    assert ktrain("fetch", "deepspeed_configs").returncode == 0
    seed = yaml.safe_load((FIXTURES / "seed" / "oom_rescue.yaml").read_text())
    if importlib.util.find_spec("ktrain_lora") is None:
        del seed["qlora"], seed["load_in_4bit"]
    config = tmp_path / "oom_rescue.yaml"
    config.write_text(yaml.safe_dump(seed), encoding="utf-8")
    done = ktrain("run", str(config), *_scaled("oom_rescue", root, tmp_path / "out"), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr[-3000:]
    losses = records(tmp_path / "out")
    assert losses.keys() == {1, 2} and all(math.isfinite(v) for v in losses.values())
