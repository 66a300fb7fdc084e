"""``lora_target_parameters``: LoRA on a mixture-of-experts model's fused expert weights, which are parameters
of the experts module rather than linear layers."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import load_file

from ktrain.testing import dataset, ktrain, model_dir, read_metrics, write_config

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


def test_the_fused_expert_weights_get_an_adapter_and_a_wrong_name_is_refused(tmp_path: Path) -> None:
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

    wrong = write_config(tmp_path, "wrong.yaml", adapter="lora", lora_target_parameters=["experts.gate_proj"])
    done = ktrain("run", str(wrong), "--set", f"output_dir={tmp_path / 'wrong'}")
    assert done.returncode == 2, done.stderr
    assert "lora_target_parameters: 'experts.gate_proj' ends the name of no parameter" in done.stderr
    assert "experts.gate_up_proj" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "wrong" / "metrics.jsonl").exists()
