"""The 4-bit base on CPU: an evaluation between training steps must not change the adapter's gradients.

bitsandbytes repacks 4-bit weights for its CPU inference kernel on the first eval-mode forward without
gradients (on CPUs with AVX512-BF16); training forwards after that run a kernel with no autograd
formula. ``attach`` turns the repacking off; this checks gradients after an eval forward against
those of a model that never evaluated.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import transformers
from bitsandbytes.functional import has_avx512bf16

from ktrain.testing import model_dir
from ktrain_lora.adapter import attach


def _qlora(root: Path) -> torch.nn.Module:
    config = transformers.AutoConfig.from_pretrained(root / "model")
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=torch.float32)
    base = type(base).from_pretrained(
        None, config=config, state_dict=base.state_dict(), quantization_config=quantization
    )
    keys = types.SimpleNamespace(
        adapter="qlora",
        qlora=False,
        load_in_4bit=False,
        load_in_8bit=False,
        lora_model_dir=None,
        lora_r=8,
        lora_alpha=16,
        lora_dropout=0.0,
        lora_target_modules=None,
        lora_target_parameters=None,
        lora_target_linear=True,
        lora_modules_to_save=None,
        peft_use_dora=False,
        peft_use_rslora=False,
        lora_fused_forward=True,
    )
    model = attach(base, keys)
    with torch.no_grad():  # a trained adapter (B starts at zero, which would hide the base's gradient path)
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return model


def _grads(model: torch.nn.Module, ids: torch.Tensor) -> dict[str, torch.Tensor]:
    model.train()
    model(input_ids=ids, labels=ids).loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


@pytest.mark.skipif(not has_avx512bf16(), reason="bitsandbytes repacks 4-bit weights only on CPUs with AVX512-BF16")
def test_an_evaluation_leaves_the_adapter_gradients_unchanged(tmp_path: Path) -> None:
    model_dir(tmp_path)
    ids = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))
    fresh = _grads(_qlora(tmp_path), ids)
    evaluated = _qlora(tmp_path)
    evaluated.eval()
    with torch.no_grad():
        evaluated(input_ids=ids)
    after = _grads(evaluated, ids)
    assert fresh.keys() == after.keys()
    for name in fresh:
        torch.testing.assert_close(after[name], fresh[name], rtol=1e-5, atol=1e-7, msg=name)


def test_mfu_counts_the_4bit_base_whole(tmp_path: Path) -> None:
    """A 4-bit weight packs two elements a byte; the kernel's FLOPs count reads its shape from quant_state."""
    from ktrain.run.metrics import non_embedding_params

    model_dir(tmp_path)
    config = transformers.AutoConfig.from_pretrained(tmp_path / "model")
    full = non_embedding_params(transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32))
    model = _qlora(tmp_path)
    adapter = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
    assert non_embedding_params(model) == full + adapter
