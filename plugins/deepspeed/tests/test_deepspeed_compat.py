"""The files users bring, trained on CPU at 2 ranks: Axolotl's bf16 ZeRO-3 JSON files. The Axolotl-style run
configs zero3.yaml and oom_rescue.yaml (their JSON fetched with ``ktrain fetch deepspeed_configs``, as an Axolotl
user does) train in tests/integration/test_seed_configs.py."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import transformers
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
