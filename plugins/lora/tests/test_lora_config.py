"""Adapter keys through ``ktrain check`` (no torch, no ranks): each bad combination names its key."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrain.cli import main
from ktrain.testing import dataset, ktrain, model_dir, write_config


@pytest.fixture
def check(tiny_config, capsys):
    """Run ``ktrain check`` on a config with ``keys``; return (exit code, stderr + stdout)."""

    def run(**keys: object) -> tuple[int, str]:
        code = main(["check", str(tiny_config(**keys))])
        out = capsys.readouterr()
        return code, out.err + out.out

    return run


@pytest.mark.parametrize(
    ("keys", "path", "words"),
    [
        ({"qlora": True, "adapter": "lora"}, "qlora", "keep one"),
        ({"load_in_4bit": True}, "load_in_4bit", "add adapter: qlora"),
        ({"load_in_8bit": True}, "load_in_8bit", "add adapter: lora"),
        ({"adapter": "lora", "load_in_4bit": True}, "load_in_4bit", "write adapter: qlora"),
        ({"adapter": "qlora", "load_in_8bit": True}, "load_in_8bit", "QLoRA's base is 4-bit"),
        ({"adapter": "qlora", "load_in_4bit": False}, "load_in_4bit", "remove load_in_4bit: false"),
        ({"adapter": "lora", "load_in_8bit": True, "peft_use_dora": True}, "peft_use_dora", "8-bit base"),
        ({"adapter": "lora", "lora_r": 0}, "lora_r", "at least 1"),
        ({"adapter": "lora", "lora_dropout": 1.0}, "lora_dropout", "[0, 1)"),
        ({"adapter": "lora", "lora_target_modules": []}, "lora_target_modules", "lora_target_linear"),
        ({"adapter": "lora", "lora_model_dir": "/nonexistent"}, "lora_model_dir", "adapter_config.json"),
        ({"adapter": "lora", "lora_r": "8"}, "lora_r", "expected an integer"),
        ({"adapter": "qlora", "bnb_config_kwargs": {"bnb_4bit_quant_typ": "nf4"}}, "bnb_config_kwargs", "did you mean"),
        ({"adapter": "qlora", "bnb_config_kwargs": {"bnb_4bit_quant_type": "int4"}}, "bnb_4bit_quant_type", "nf4"),
        (
            {"adapter": "lora", "load_in_8bit": True, "fsdp_version": 2, "fsdp_config": {}},
            "load_in_8bit",
            "FSDP cannot shard 8-bit",
        ),
        (
            {"adapter": "qlora", "random_init_weights": True, "deepspeed": {"zero_optimization": {"stage": 3}}},
            "random_init_weights",
            "save the random model",
        ),
        (
            {
                "adapter": "qlora",
                "bf16": True,
                "fsdp_version": 2,
                "bnb_config_kwargs": {"bnb_4bit_quant_storage": "float32"},
            },
            "bnb_config_kwargs.bnb_4bit_quant_storage",
            "use bfloat16",
        ),
    ],
)
def test_bad_adapter_config_names_the_key(check, keys: dict, path: str, words: str) -> None:
    code, out = check(**keys)
    assert code == 2, out
    line = next((line for line in out.splitlines() if line.startswith("  - ") and path in line), None)
    assert line is not None, out
    assert words in line, line


def test_axolotl_qlora_spellings_check_and_lora_keys_alone_are_warned_about(check) -> None:
    code, out = check(qlora=True, load_in_4bit=True, lora_target_linear=True, lora_r=16)
    assert code == 0, out
    assert "export: 'lora' (ktrain-plugin-lora" in out and "enabled by qlora, load_in_4bit" in out
    code, out = check(lora_r=16)
    assert code == 0, out
    assert "warning: lora_r: has no effect without an adapter" in out


def test_a_wrong_target_module_stops_before_training_naming_the_key(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 40)
    config = write_config(tmp_path, adapter="lora", lora_target_modules=["q_prj"])
    done = ktrain("run", str(config))
    assert done.returncode == 2, done.stderr
    assert "lora_target_modules: Target modules {'q_prj'} not found" in done.stderr
    assert "q_proj" in done.stderr  # the modules the model has
    assert not (tmp_path / "out" / "metrics.jsonl").exists()


def test_new_tokens_under_an_adapter_need_trained_embeddings(check) -> None:
    code, out = check(adapter="lora", tokens=["<|tool|>"])
    assert code == 2 and "tokens: adds tokens whose new embedding rows an adapter does not train" in out
    code, out = check(adapter="lora", tokens=["<|tool|>"], lora_modules_to_save=["embed_tokens", "lm_head"])
    assert code == 0, out
