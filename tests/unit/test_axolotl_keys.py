"""Axolotl's keys: each is owned by ktrain, accepted with a note, or refused with what ktrain offers instead.

The configs under tests/fixtures/axolotl/ are written in Axolotl's style; MODEL, DATA and OUT are replaced
with a tiny local model folder, a chat jsonl and a run directory.
"""

from __future__ import annotations

import collections
import json
import subprocess
import sys
import types
import typing
from pathlib import Path

import attrs
import pytest
import safetensors.torch
import torch
import transformers
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from ktrain.builtin.hf_model import HFModel, build_model
from ktrain.config.activation import discover
from ktrain.config.axolotl import HANDLED_HERE, _attrs_class, check_plugins, classify, sift
from ktrain.config.axolotl_keys import (
    ACCEPTED,
    ACCEPTED_INTEGRATIONS,
    AXOLOTL_VERSION,
    DATASET_ITEM,
    FSDP_CONFIG,
    INTEGRATIONS,
    TOP_LEVEL,
    TRL,
    UNSUPPORTED,
)
from ktrain.config.install import install_command
from ktrain.config.keys import PLUGIN_KEYS
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError, Report
from ktrain.data import cache
from ktrain.testing.assets import write_model_dir

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "axolotl"


def _sections() -> list[type]:
    sections: list[type] = []
    register = lambda cls, *, plugin, docs_url=None: sections.append(cls)  # noqa: E731
    discover().call_with_callback("ktrain_register_config", register=register)
    return sections


def _owned() -> set[str]:
    """Every catalogue name a ktrain section declares: top level, ``datasets[].x`` and ``fsdp_config.x``."""
    owned = {k for keys in PLUGIN_KEYS.values() for k in keys} | set(HANDLED_HERE)
    for cls in _sections():
        hints = typing.get_type_hints(cls)
        for f in attrs.fields(cls):
            owned.add(f.name)
            inner = _attrs_class(hints[f.name])
            prefix = {"datasets": "datasets[]", "fsdp_config": "fsdp_config"}.get(f.name)
            if inner is not None and prefix:
                owned |= {f"{prefix}.{g.name}" for g in attrs.fields(inner)}
    return owned


def _catalogue() -> list[str]:
    return [
        *TOP_LEVEL,
        *(f"datasets[].{k}" for k in DATASET_ITEM),
        *(f"fsdp_config.{k}" for k in FSDP_CONFIG),
        *(f"trl.{k}" for k in TRL),
    ]


def test_every_catalogue_key_is_in_exactly_one_class() -> None:
    owned = _owned()
    listed = collections.Counter(k for group in (ACCEPTED, UNSUPPORTED) for keys in group.values() for k in keys)
    catalogue = _catalogue()
    assert [k for k, n in listed.items() if n > 1] == [], "a key listed twice"
    assert set(listed) <= set(catalogue), f"classed but not Axolotl's: {set(listed) - set(catalogue)}"
    assert [k for k in catalogue if k in owned and k in listed] == [], "owned and also accepted or unsupported"
    assert [k for k in catalogue if k not in owned and k not in listed] == [], "a key with no class"


def _write(name: str, tmp_path: Path, model: Path, data: Path) -> Path:
    text = (FIXTURES / name).read_text(encoding="utf-8")
    text = text.replace("MODEL", str(model)).replace("DATA", str(data)).replace("OUT", str(tmp_path / "out"))
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def test_axolotl_style_config_passes_with_one_note_per_key(tmp_path, tiny_model_dir, tiny_chat_jsonl) -> None:
    plan = prepare(_write("lora_sft.yaml", tmp_path, tiny_model_dir, tiny_chat_jsonl))
    notes = {str(p.path): p.message for p in plan.warnings}
    for key in ("strict", "tokenizer_type", "remove_unused_columns", "skip_prepare_dataset", "lora_mlp_kernel"):
        assert notes[key].startswith("accepted, no effect in ktrain: "), key
    assert notes["datasets[0].trust_remote_code"].startswith("accepted, no effect in ktrain: ")  # nested
    assert "ktrain-plugin-liger does this job" in notes["plugins[0]"]
    assert "accepted as off" in notes["activation_offloading"]
    assert plan.config.lora_r == 8 and plan.config.liger_rms_norm is True


def test_unsupported_keys_are_refused_with_what_ktrain_offers(tmp_path, tiny_model_dir, tiny_chat_jsonl) -> None:
    path = _write("unsupported.yaml", tmp_path, tiny_model_dir, tiny_chat_jsonl)
    result = subprocess.run(
        [sys.executable, "-m", "ktrain.cli", "check", str(path)], capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    expected = {
        "processor_kwargs: not supported: this vision setting": "ktrain-plugin-vision",
        "lisa_n_layers: not supported": "unfrozen_parameters",
        "curriculum_sampling: not supported": "sample_packing",
        "plugins[0]: axolotl.integrations.swanlab.SwanLabPlugin": "no ktrain equivalent",
        "datasets[0].field_human: not supported": "message_property_mappings",
        "fsdp_config.mixed_precision_policy: not supported": "bf16",
    }
    for start, says in expected.items():
        assert any(start in line and says in line for line in lines), f"{start} ... {says}\n{result.stderr}"
    assert "unknown key" not in result.stderr


def test_activation_offloading_batch_size_cut_cross_entropy_xformers_are_translated(
    tmp_path, tiny_model_dir, tiny_chat_jsonl
) -> None:
    path = _write("lora_sft.yaml", tmp_path, tiny_model_dir, tiny_chat_jsonl)
    plan = prepare(
        path,
        [
            "gradient_checkpointing=true",
            "activation_offloading=true",
            "batch_size=8",
            "micro_batch_size=2",
            "gradient_accumulation_steps=null",
        ],
    )
    notes = {str(p.path): p.message for p in plan.warnings}
    assert (
        plan.config.gradient_checkpointing == "offload"
        and "gradient_checkpointing: offload" in notes["activation_offloading"]
    )
    assert plan.config.gradient_accumulation_steps == 4 and "gradient_accumulation_steps: 4" in notes["batch_size"]
    written = prepare(path, ["batch_size=8", "gradient_accumulation_steps=2"])
    assert written.config.gradient_accumulation_steps == 2
    fused = prepare(path, ["cut_cross_entropy=true", "attn_implementation=xformers"])
    assert fused.config.fused_linear_cross_entropy is True and fused.config.attn_implementation == "sdpa"
    with pytest.raises(ConfigError) as e:
        prepare(path, ["gradient_checkpointing=false", "activation_offloading=true", "batch_size=0"])
    assert "activation_offloading: needs gradient_checkpointing: true" in str(e.value)
    assert "batch_size: expected a positive integer" in str(e.value)


def test_a_typo_is_still_unknown_with_did_you_mean(tmp_path, tiny_model_dir, tiny_chat_jsonl) -> None:
    path = _write("lora_sft.yaml", tmp_path, tiny_model_dir, tiny_chat_jsonl)
    with pytest.raises(ConfigError) as e:
        prepare(path, ["tokenizer_typ=AutoTokenizer", "datasets.0.roles_to_trian=[assistant]"])
    text = str(e.value)
    assert "tokenizer_typ: unknown key; did you mean 'tokenizer_type'?" in text
    assert "datasets[0].roles_to_trian: unknown key; did you mean 'roles_to_train'?" in text


def test_plugins_list() -> None:
    report = Report()
    check_plugins(
        [
            "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin",
            "axolotl.integrations.kd.KDPlugin",
            "ktrain-plugin-liger",
            "ktrain-plugin-lora",
            "my_company.MagicPlugin",
        ],
        report,
        installed={"ktrain-plugin-lora"},
    )
    found = {p.path: (p.severity, p.message) for p in report.problems}
    assert found["plugins[0]"] == (
        "error",
        "axolotl.integrations.cut_cross_entropy.CutCrossEntropyPlugin: ktrain-plugin-fused-loss does this job in "
        f"ktrain, not installed: `{install_command('ktrain-plugin-fused-loss')}`",
    )
    assert (
        found["plugins[1]"][0] == "error"
        and "knowledge distillation has no ktrain equivalent" in found["plugins[1]"][1]
    )
    assert found["plugins[2]"] == (
        "error",
        f"ktrain-plugin-liger: not installed: `{install_command('ktrain-plugin-liger')}`",
    )
    assert found["plugins[3]"][0] == "warning"
    assert found["plugins[4]"][0] == "error" and "neither an Axolotl integration" in found["plugins[4]"][1]


def test_moe_kernels_that_compute_the_same_experts_are_accepted_and_those_changing_them_refused() -> None:
    report = Report()
    check_plugins(["axolotl.integrations.kernels.KernelsPlugin"], report, installed=set())
    assert [(p.severity, p.message) for p in report.problems] == [
        (
            "warning",
            "axolotl.integrations.kernels.KernelsPlugin: accepted, no effect in ktrain: "
            + ACCEPTED_INTEGRATIONS["kernels"],
        )
    ]
    for key in ("use_kernels", "use_scattermoe", "use_sonicmoe", "expert_backend", "experts_implementation"):
        assert classify(key)[0] == "accepted", key
    for key in ("use_dsv4_kernels", "expert_parallel_size"):
        assert classify(key)[0] == "unsupported", key


def test_kernels_for_the_same_computation_and_memory_only_keys_are_accepted_with_what_differs() -> None:
    for key in ("fused_attn_kernel", "flex_attn_compile_kwargs", "liger_rms_norm_gated"):
        assert classify(key)[1].startswith("a fused or compiled kernel for the same computation"), key
    assert "more activation memory" in classify("tiled_mlp")[1]
    assert "2 to 4 times the memory" in classify("quantize_moe_experts")[1]
    assert "peft sets it from each module's type" in classify("lora_fan_in_fan_out")[1]
    assert "does not push" in classify("hub_model_id")[1]
    for key in ("tiled_mlp", "quantize_moe_experts", "lora_fan_in_fan_out", "hub_model_id"):
        assert classify(key)[0] == "accepted", key


def test_reinit_weights_gemma4_attention_checkpointing_tokens_and_warmup_are_translated(
    tmp_path, tiny_model_dir, tiny_chat_jsonl
) -> None:
    path = _write("lora_sft.yaml", tmp_path, tiny_model_dir, tiny_chat_jsonl)
    plan = prepare(
        path,
        [
            "reinit_weights=true",
            "attn_implementation=flash_attention_2",
            "gemma4_hybrid_attn_impl=true",
            "fsdp_version=2",
            "fsdp_config.activation_checkpointing=true",
            "fsdp_config.auto_wrap_policy=TRANSFORMER_BASED_WRAP",
            "fsdp_config.transformer_layer_cls_to_wrap=LlamaDecoderLayer",
            "bf16=true",
        ],
    )
    notes = {str(p.path): p.message for p in plan.warnings}
    assert plan.config.random_init_weights is True and "random_init_weights: true" in notes["reinit_weights"]
    assert plan.config.attn_implementation == "sdpa" and "head_dim 512" in notes["gemma4_hybrid_attn_impl"]
    assert plan.config.gradient_checkpointing is False and "once" in notes["gradient_checkpointing"]
    older = prepare(path, ["tokens={bos_token: <s>, eos_token: </s>}", "warmup_ratio=null", "warmup_steps=0.25"])
    notes = {str(p.path): p.message for p in older.warnings}
    assert older.config.special_tokens == {"bos_token": "<s>", "eos_token": "</s>"} and older.config.tokens is None
    assert "special_tokens" in notes["tokens"]
    assert older.config.warmup_ratio == 0.25 and older.config.warmup_steps is None and "share" in notes["warmup_steps"]
    with pytest.raises(ConfigError) as e:
        prepare(path, ["reinit_weights=yes please", "gemma4_hybrid_attn_impl=2"])
    assert "reinit_weights: expected true or false" in str(e.value)
    assert "gemma4_hybrid_attn_impl: expected true or false" in str(e.value)


def test_refusals_say_what_ktrain_offers_linearized_experts_and_dpo_beta() -> None:
    assert "classification heads" in classify("num_labels")[1] and "rl: dpo" in classify("reward_model")[1]
    assert "generation engine" in classify("trl")[1] and "not installed" not in classify("vllm")[1]
    report = Report()
    fused = {"llama4_linearized_experts": True, "adapter": "qlora", "lora_target_modules": ["self_attn.q_proj"]}
    assert sift(fused, {}, report, set()) == {"adapter": "qlora", "lora_target_modules": ["self_attn.q_proj"]}
    assert "the same parameters train" in report.problems[-1].message and not report.errors
    sift({**fused, "lora_target_modules": ["experts.up_projs.[0-9]+$"]}, {}, report, set())
    sift({**fused, "lora_target_linear": True}, {}, report, set())
    assert [p.message.startswith("puts LoRA on each expert") for p in report.problems[-2:]] == [True, True]
    report = Report()
    assert sift({"dpo_beta": 0.2}, {}, report, set()) == {"rl_beta": 0.2}
    assert sift({"dpo_beta": 0.2, "rl_beta": 0.1}, {}, report, set()) == {"rl_beta": 0.1}
    assert [p.message for p in report.problems] == [
        "read as rl_beta (Axolotl's former spelling)",
        "not used: rl_beta is written, and Axolotl reads it first",
    ]


def test_dataset_types_of_trainers_ktrain_lacks_are_refused_with_what_they_are() -> None:
    report = Report()
    rows = [{"path": "d", "type": "ebft_pretrain.transform"}, {"path": "d", "type": "bradley_terry.chat_template"}]
    sift({"datasets": rows}, {}, report, set())
    assert [str(p.path) for p in report.errors] == ["datasets[0].type", "datasets[1].type"]
    assert "generation engine" in report.errors[0].message and "reward models" in report.errors[1].message


def test_mistral_common_is_read_as_the_folder_s_tokenizer_json_which_the_loader_loads(
    tmp_path, tiny_config, tiny_model_dir
) -> None:
    report = Report()
    sift({"tokenizer_use_mistral_common": True, "base_model": str(tiny_model_dir)}, {}, report, set())
    assert "read as the folder's Hugging Face tokenizer (tokenizer.json)" in report.problems[-1].message
    sift({"tokenizer_use_mistral_common": True, "base_model": str(tmp_path)}, {}, report, set())
    assert report.errors[-1].message.startswith(f"{tmp_path} has no tokenizer.json")
    mistral_common = pytest.importorskip("mistral_common")  # installed, it makes AutoTokenizer pick its tokenizer
    folder = write_model_dir(tmp_path / "mistral", model_type="mistral")
    (folder / "tekken.json").symlink_to(Path(mistral_common.__file__).parent / "data" / "tekken_240911.json")
    config = prepare(tiny_config(base_model=str(folder), random_init_weights=True)).config
    tokenizer = HFModel(config).ktrain_load_tokenizer(run=None)
    assert type(tokenizer).__name__ != "MistralCommonBackend" and tokenizer("ab", return_offsets_mapping=True)


def test_eta_min_is_accepted_as_axolotl_drops_it_with_the_ratio_that_gives_the_floor() -> None:
    report = Report()
    assert sift({"eta_min": "7e-7", "learning_rate": 5e-6}, {}, report, set()) == {"learning_rate": 5e-6}
    assert "cosine_min_lr_ratio: 0.14" in report.problems[-1].message and not report.errors
    sift({"eta_min": "low"}, {}, report, set())
    assert report.errors[-1].message == "expected a non-negative number, got 'low'"


def _mxfp4_gpt_oss(folder: Path) -> dict[str, torch.Tensor]:
    """A tiny gpt-oss folder whose experts are stored as gpt-oss's checkpoints store them: MXFP4 blocks and
    scales (seeded random bytes), with the config's ``quantization_config`` saying so. Returns those tensors."""
    config = transformers.GptOssConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        num_local_experts=2,
        num_experts_per_tok=1,
        layer_types=["full_attention"],
    )
    transformers.GptOssForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)
    dense = safetensors.torch.load_file(folder / "model.safetensors")
    generator = torch.Generator().manual_seed(0)
    packed = {}
    for name in [n for n in dense if n.endswith(("experts.gate_up_proj", "experts.down_proj"))]:
        experts, columns, rows = dense.pop(name).shape
        packed[f"{name}_blocks"] = torch.randint(0, 256, (experts, rows, columns // 32, 16), generator=generator)
        packed[f"{name}_scales"] = torch.randint(125, 130, (experts, rows, columns // 32), generator=generator)
    packed = {name: tensor.to(torch.uint8) for name, tensor in packed.items()}
    safetensors.torch.save_file({**dense, **packed}, folder / "model.safetensors", metadata={"format": "pt"})
    written = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    written["quantization_config"] = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn"]}
    (folder / "config.json").write_text(json.dumps(written), encoding="utf-8")
    return packed


def test_mxfp4_dequantized_is_read_as_model_config_and_loads_the_dequantized_weights_to_train(
    tmp_path, tiny_config, tiny_model_dir
) -> None:
    packed = _mxfp4_gpt_oss(tmp_path / "gpt-oss")
    mxfp4 = {"model_quantization_config": "Mxfp4Config", "tokenizer_config": str(tiny_model_dir), "bf16": True}
    mxfp4["attn_implementation"] = "eager"  # gpt-oss attention has sinks, which SDPA does not take
    dequantized = {"model_quantization_config_kwargs": {"dequantize": True}}
    plan = prepare(tiny_config(base_model=str(tmp_path / "gpt-oss"), **dequantized, **mxfp4))
    assert plan.config.model_config == {"quantization_config": {"quant_method": "mxfp4", "dequantize": True}}
    model = build_model(plan.config, types.SimpleNamespace(device=torch.device("cpu")), {})
    experts = model.model.layers[0].mlp.experts
    blocks, scales = (packed[f"model.layers.0.mlp.experts.gate_up_proj_{part}"] for part in ("blocks", "scales"))
    dequantized = convert_moe_packed_tensors(blocks, scales, dtype=torch.bfloat16).float()
    assert torch.equal(experts.gate_up_proj.detach().float(), dequantized) and experts.gate_up_proj.requires_grad
    with pytest.raises(ConfigError) as e:
        prepare(tiny_config(**mxfp4))
    assert "model_quantization_config_kwargs: training on MXFP4 weights is not supported" in str(e.value)
    with pytest.raises(ConfigError) as e:
        prepare(tiny_config(model_quantization_config="HqqConfig", model_quantization_config_kwargs={"nbits": 4}))
    assert "model_quantization_config: 'HqqConfig' is not supported; ktrain-plugin-lora loads" in str(e.value)


def test_alpaca_chat_renders_axolotl_s_chat_layout_with_loss_on_the_output(
    tmp_path, tiny_config, tiny_model_dir
) -> None:
    rows = [{"instruction": "Add.", "input": "2 and 3", "output": "5"}, {"instruction": "Say hi.", "output": "hi"}]
    data = tmp_path / "alpaca.jsonl"
    data.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    plan = prepare(tiny_config(datasets=[{"path": str(data), "type": "alpaca:chat"}]), world_size=1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_model_dir)
    samples = cache.build(plan.config, tokenizer, plan.formats).train
    prompts = [
        "SYSTEM: Below is an instruction that describes a task, paired with an input that provides further context. "
        "Write a response that appropriately completes the request.\nUSER: Add.\n2 and 3\nASSISTANT:",
        "SYSTEM: Below is an instruction that describes a task. Write a response that appropriately completes the "
        "request.\nUSER: Say hi.\nASSISTANT:",
    ]
    for sample, prompt, row in zip(samples, prompts, rows, strict=True):
        prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]  # the tokenizer has no BOS
        answer = [*tokenizer(row["output"], add_special_tokens=False)["input_ids"], tokenizer.eos_token_id]
        assert [int(i) for i in sample.input_ids] == prompt_ids + answer
        assert [int(i) for i in sample.labels] == [-100] * len(prompt_ids) + answer


def test_classify_names_nested_keys_by_prefix() -> None:
    assert classify("trl.beta")[0] == "unsupported"
    assert "reward models" in classify("datasets[].step_separator")[1]  # a process reward model's dataset
    assert "synthetic" in classify("datasets[].min_input_id")[1]
    assert classify("fsdp_config.use_orig_params")[0] == "accepted"
    assert classify("not_an_axolotl_key") is None


# ---------------------------------------------------------------------------------------------------
# docs/config.md: the table of Axolotl's keys by class, generated from the catalogue
# ---------------------------------------------------------------------------------------------------

CONFIG_MD = Path(__file__).resolve().parents[2] / "docs" / "config.md"
START = "<!-- axolotl-keys:start (generated by `python tests/unit/test_axolotl_keys.py`) -->\n"
END = "<!-- axolotl-keys:end -->\n"


def _names(keys: typing.Iterable[str]) -> str:
    return ", ".join(f"`{k}`" for k in keys)


def axolotl_reference() -> str:
    """The generated part of docs/config.md: Axolotl's keys owned by ktrain, accepted with a note, refused."""
    declared = _owned()  # once: it reads the type hints of every section
    owned = [k for k in _catalogue() if k in declared]
    out = [
        f"Read from Axolotl {AXOLOTL_VERSION}: {len(_catalogue())} keys.",
        "",
        f"**Owned by ktrain** ({len(owned)}; `ktrain keys` says which plugin): {_names(owned)}.",
        "",
        f"**Accepted with a note, no effect in ktrain** ({sum(map(len, ACCEPTED.values()))}):",
        "",
        "| why | keys |",
        "| --- | --- |",
        *(f"| {reason} | {_names(keys)} |" for reason, keys in ACCEPTED.items()),
        "",
        f"**Not supported** ({sum(map(len, UNSUPPORTED.values()))}; false or empty is accepted as off, with a note):",
        "",
        "| why, and what ktrain offers | keys |",
        "| --- | --- |",
        *(f"| {reason} | {_names(keys)} |" for reason, keys in UNSUPPORTED.items()),
        "",
        "`plugins:` entries: "
        + "; ".join(
            f"`axolotl.integrations.{module}`: " + (f"{dist} does this job" if dist else f"{what}, no equivalent")
            for module, (dist, what) in INTEGRATIONS.items()
        )
        + "; "
        + "; ".join(f"`axolotl.integrations.{name}`: accepted, {what}" for name, what in ACCEPTED_INTEGRATIONS.items())
        + ".",
    ]
    return "\n".join(out) + "\n"


def write_config_md() -> None:
    """Rewrite the generated Axolotl part of docs/config.md."""
    text = CONFIG_MD.read_text(encoding="utf-8")
    head, _, rest = text.partition(START)
    _, _, tail = rest.partition(END)
    CONFIG_MD.write_text(f"{head}{START}{axolotl_reference()}{END}{tail}", encoding="utf-8")


def test_config_md_axolotl_table_is_current() -> None:
    text = CONFIG_MD.read_text(encoding="utf-8")
    assert START in text and END in text
    generated = text.partition(START)[2].partition(END)[0]
    assert generated == axolotl_reference(), (
        "docs/config.md is stale; regenerate with `python tests/unit/test_axolotl_keys.py`"
    )


if __name__ == "__main__":
    write_config_md()
