"""The pass that precomputes the reference runs a peft model with its adapter on only while the adapter leaves the
base unchanged (as peft initializes it), so that it is the forward of the policy's first step; else switched off."""

from __future__ import annotations

from pathlib import Path

import peft
import torch

from ktrain.testing import model_dir
from ktrain_preference.reference import _as_reference, unchanged_base


def _lora(tmp_path: Path, **keys: object) -> peft.PeftModel:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir(tmp_path, weights=True), dtype=torch.float32)
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear", **keys))


def test_an_adapter_as_initialized_stays_on_and_a_trained_one_is_switched_off(tmp_path: Path) -> None:
    model = _lora(tmp_path)
    assert unchanged_base(model)
    ids = torch.tensor([[3, 4, 5, 6]])
    with _as_reference(model):
        assert not model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters  # the policy's forward
        on = model(input_ids=ids).logits
    with model.disable_adapter():
        torch.testing.assert_close(on, model(input_ids=ids).logits, rtol=0, atol=1e-6)  # the same function

    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n)[0, 0] = 0.5
    assert not unchanged_base(model)
    with _as_reference(model):
        assert model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters


def test_modules_trained_in_full_switch_the_adapter_off(tmp_path: Path) -> None:
    assert not unchanged_base(_lora(tmp_path, modules_to_save=["lm_head"]))
