"""The pass that precomputes the reference runs a peft model with its adapter on only while the adapter leaves the
base unchanged (as peft initializes it), so that it is the forward of the policy's first step; else switched off."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import peft
import pytest
import torch

from ktrain.testing import ktrain, model_dir, write_config
from ktrain_preference.reference import _as_reference, unchanged_base


def _lora(tmp_path: Path, **keys: object) -> peft.PeftModel:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir(tmp_path, weights=True), dtype=torch.float32)
    return peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules="all-linear", **keys))


def test_an_adapter_as_initialized_stays_on_and_a_trained_one_is_switched_off(tmp_path: Path) -> None:
    model = _lora(tmp_path)
    assert unchanged_base(model)
    ids = torch.tensor([[3, 4, 5, 6]])
    reference, as_policy = _as_reference(model)
    assert as_policy
    with reference:
        assert not model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters  # the policy's forward
        on = model(input_ids=ids).logits
    with model.disable_adapter():
        torch.testing.assert_close(on, model(input_ids=ids).logits, rtol=0, atol=1e-6)  # the same function

    with torch.no_grad():
        next(p for n, p in model.named_parameters() if "lora_B" in n)[0, 0] = 0.5
    assert not unchanged_base(model)
    reference, as_policy = _as_reference(model)
    assert not as_policy
    with reference:
        assert model.base_model.model.model.layers[0].self_attn.q_proj.disable_adapters


def test_modules_trained_in_full_switch_the_adapter_off(tmp_path: Path) -> None:
    assert not unchanged_base(_lora(tmp_path, modules_to_save=["lm_head"]))


def test_with_dropout_the_pass_runs_in_evaluation_mode(tmp_path: Path) -> None:
    """A training-mode forward would drop activations out of the reference: the adapter stays on (it leaves the
    base unchanged), the pass runs without dropout and without autograd."""
    reference, as_policy = _as_reference(_lora(tmp_path, lora_dropout=0.1))
    assert isinstance(reference, contextlib.nullcontext) and not as_policy


@pytest.mark.parametrize("adapter", ["lora", None])
def test_a_compiled_bf16_policy_starts_at_ln_2_to_the_bit(tmp_path: Path, adapter: str | None) -> None:
    """Compiled blocks in a bf16 residual stream: the precomputing pass runs the first step's own forward (training
    mode, autograd recording), so step 1's DPO loss is ln 2 exactly. A forward without autograd is another graph,
    which rounded differently under LoRA (0.693176 on this model)."""
    model = model_dir(tmp_path, weights=True)
    keys = {"adapter": "lora", "lora_r": 8, "lora_alpha": 16, "lora_target_linear": True} if adapter else {}
    config = write_config(
        tmp_path,
        base_model=str(model),
        datasets=[{"path": str(model), "type": "chat_template.default"}],  # named for the check; bench's pairs
        rl="dpo",
        precompute_ref_log_probs=True,
        bf16=True,
        bfloat16=True,
        torch_compile=True,
        micro_batch_size=4,
        sequence_len=128,
        **keys,
    )
    report = tmp_path / "bench.json"
    done = ktrain("bench", str(config), "--pairs", "32:32", "--warmup", "0", "--steps", "1", "--json", str(report))
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(report.read_text())["ktrain"]["first_loss"] == pytest.approx(math.log(2), rel=0, abs=1e-7)
