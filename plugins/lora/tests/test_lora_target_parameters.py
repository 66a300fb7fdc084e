"""``lora_target_parameters``: LoRA on a mixture-of-experts model's fused expert weights, which are parameters
of the experts module rather than linear layers."""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForCausalLM

from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.testing import dataset, ktrain, model_dir, read_metrics, write_config
from ktrain_lora.adapter import attach

TINY_QWEN3_MOE = {
    "architectures": ["Qwen3MoeForCausalLM"],
    "model_type": "qwen3_moe",
    "num_hidden_layers": 1,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 32,
    "decoder_sparse_step": 1,
    "mlp_only_layers": [],
    "norm_topk_prob": True,
}


def test_the_fused_expert_weights_get_an_adapter(tmp_path: Path) -> None:
    model_dir(tmp_path, **TINY_QWEN3_MOE)
    dataset(tmp_path, 16)
    config = write_config(
        tmp_path, adapter="lora", lora_target_modules=["q_proj"], lora_target_parameters=["experts.gate_up_proj"]
    )
    done = ktrain("run", str(config), "--set", "max_steps=2")
    assert done.returncode == 0, done.stderr
    assert len(read_metrics(tmp_path / "out")) == 2
    adapter = load_file(tmp_path / "out" / "final" / "adapter_model.safetensors")
    experts = [name for name in adapter if "mlp.experts.lora_" in name]
    assert len(experts) == 2, sorted(adapter)  # lora_A and lora_B of the one layer's gate_up_proj
    assert any("q_proj.lora_A" in name for name in adapter)


def test_a_name_no_parameter_ends_with_is_refused_by_its_key(tmp_path: Path) -> None:
    model_dir(tmp_path, **TINY_QWEN3_MOE)
    dataset(tmp_path, 16)
    plan = prepare(write_config(tmp_path, adapter="lora", lora_target_parameters=["experts.gate_proj"]))
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tmp_path / "model"))
    with pytest.raises(ConfigError) as e:
        attach(model, plan.config)
    assert "lora_target_parameters: 'experts.gate_proj' ends the name of no parameter" in str(e.value)
    assert "experts.gate_up_proj" in str(e.value)  # the model's matrices outside linear layers
