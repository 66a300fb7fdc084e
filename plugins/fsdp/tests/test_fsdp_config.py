"""FSDP keys through the real ``ktrain check``/``run``/``migrate`` commands: migration notes, bad input, roles.

Nothing here trains; each case runs the CLI in process (or, for the import check, in a fresh one).
"""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import types
from pathlib import Path

import attrs
import pytest
import torch
import transformers
import yaml

from ktrain import hookimpl
from ktrain.cli import main
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.plugins import PluginError
from ktrain_fsdp.options import FsdpOptions
from tests.kit import REPO

SEED = REPO / "tests" / "fixtures" / "seed"
HERE = Path(__file__).resolve().parent


@pytest.fixture
def sets(tiny_model_dir: Path, tiny_chat_jsonl: Path, tmp_path: Path) -> list[str]:
    """``--set`` arguments pointing an Axolotl-style config at the tiny local model and data."""
    pairs = {
        "base_model": tiny_model_dir,
        "datasets": f"[{{path: {tiny_chat_jsonl}, type: chat_template}}]",
        "output_dir": tmp_path / "out",
    }
    return [arg for key, value in pairs.items() for arg in ("--set", f"{key}={value}")]


@pytest.fixture
def write(tiny_config):
    """Write a config over the tiny model with ``keys`` on top; return its path."""
    return tiny_config


def run_cli(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out, err = capsys.readouterr()
    return code, out, err


def options_of(path: Path, *overrides: str) -> FsdpOptions:
    plan = prepare(path, list(overrides), with_defaults=True)  # the runtime object is built on the ranks
    return plan.plugins.role_owners()["sharding"].obj.options


# ---------------------------------------------------------------------------------------------------
# Axolotl-style FSDP configs as users write them
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["fsdp1.yaml", "fsdp2.yaml"])
def test_seed_configs_pass_check_without_notes(name: str, sets: list[str], capsys) -> None:
    code, out, err = run_cli(capsys, "check", SEED / name, *sets)
    assert code == 0, err
    assert "sharding, checkpoint_format: 'fsdp' (ktrain-plugin-fsdp" in out
    assert "model_loader: 'fsdp'" in out  # cpu_ram_efficient_loading: true
    assert "warning" not in out


def test_hsdp_tp_seed_config_fsdp_keys_pass(sets: list[str], capsys) -> None:
    """hsdp_tp.yaml also needs tensor parallelism (another plugin): no problem of it is an FSDP one."""
    code, _, err = run_cli(capsys, "check", SEED / "hsdp_tp.yaml", *sets)
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    if code != 0:
        assert problems and all(line.startswith("  - tensor_parallel_size:") for line in problems), err
    options = options_of(SEED / "hsdp_tp.yaml", *sets[1::2], "tensor_parallel_size=1", "dp_shard_size=2")
    assert (options.version, options.sharding_strategy, options.state_dict_type) == (
        2,
        "HYBRID_SHARD",
        "FULL_STATE_DICT",
    )


def test_fsdp1_seed_config_under_version_2_shows_each_new_spelling(sets: list[str], capsys) -> None:
    code, out, err = run_cli(capsys, "check", SEED / "fsdp1.yaml", "--set", "fsdp_version=2", *sets)
    assert code == 0, err
    notes = {line for line in out.splitlines() if line.startswith("warning: fsdp_config.")}
    expected = {
        "fsdp_sharding_strategy": "`fsdp_config.reshard_after_forward: true`",
        "fsdp_offload_params": "`fsdp_config.offload_params: false`",
        "fsdp_cpu_ram_efficient_loading": "`fsdp_config.cpu_ram_efficient_loading: true`",
        "fsdp_transformer_layer_cls_to_wrap": "`fsdp_config.transformer_layer_cls_to_wrap: LlamaDecoderLayer`",
    }
    assert len(notes) == len(expected), notes
    for key, spelling in expected.items():
        assert any(n.startswith(f"warning: fsdp_config.{key}: FSDP1 spelling") and spelling in n for n in notes), key
    migrated = options_of(SEED / "fsdp1.yaml", "fsdp_version=2", *sets[1::2])
    assert migrated == options_of(SEED / "fsdp2.yaml", *sets[1::2])


# ---------------------------------------------------------------------------------------------------
# Bad input: each error names its key and says what to do
# ---------------------------------------------------------------------------------------------------

BAD = [
    ({"fsdp_version": 2, "fsdp_config": {"fsdp_sharding_strategy": "NO_SHARD"}},
     "fsdp_config.fsdp_sharding_strategy", "NO_SHARD has no FSDP2 meaning"),
    ({"fsdp_version": 2, "fsdp_config": {"fsdp_sharding_strategy": "HYBRID_SHARD"}},
     "fsdp_config.fsdp_sharding_strategy", "set reshard_after_forward: true and dp_replicate_size"),
    ({"fsdp_version": 2, "fsdp_config": {"fsdp_sharding_strategy": "SHARD_GRAD_OP", "reshard_after_forward": True}},
     "fsdp_config.fsdp_sharding_strategy", "remove fsdp_sharding_strategy"),
    ({"fsdp_version": 1, "fsdp_config": {"reshard_after_forward": False}},
     "fsdp_config.reshard_after_forward", "under fsdp_version: 1 write fsdp_sharding_strategy"),
    ({"fsdp_version": 1, "dp_replicate_size": 2},
     "dp_replicate_size", "HYBRID_SHARD"),
    ({"fsdp_version": 1, "tensor_parallel_size": 2},
     "fsdp_version", "set fsdp_version: 2"),
    ({"fsdp_version": 2, "fsdp_config": {"auto_wrap_policy": "SIZE_BASED_WRAP"}},
     "fsdp_config.auto_wrap_policy", "needs min_num_params"),
    ({"fsdp_version": 2, "fsdp_config": {"activation_checkpointing_fraction": 0.5}},
     "fsdp_config.activation_checkpointing_fraction", "set fsdp_config.activation_checkpointing: true"),
    ({"fsdp_version": 2, "fsdp_config": {"activation_checkpointing": True, "activation_checkpointing_fraction": 0}},
     "fsdp_config.activation_checkpointing_fraction", "must be above 0 and at most 1, not 0"),
    ({"fsdp_version": 1, "fsdp_config": {"activation_checkpointing_fraction": 0.5}},
     "fsdp_config.activation_checkpointing_fraction", "is FSDP2 only"),
    ({"fsdp_version": 2, "fsdp_config": {"activation_checkpointing_scope": "mlp"}},
     "fsdp_config.activation_checkpointing_scope", "set fsdp_config.activation_checkpointing: true"),
    ({"fsdp_version": 1, "fsdp_config": {"activation_checkpointing": True, "activation_checkpointing_scope": "mlp"}},
     "fsdp_config.activation_checkpointing_scope", "is FSDP2 only"),
    ({"fsdp_version": 2, "fsdp_config": {"activation_checkpointing": True, "activation_checkpointing_scope": "attn"}},
     "fsdp_config.activation_checkpointing_scope", "'block'"),
    ({"fsdp_version": 1, "weight_decay": 0.1, "fsdp_config": {"fsdp_use_orig_params": False}},
     "fsdp_config.fsdp_use_orig_params", "weight_decay"),
    ({"fsdp_version": 2, "fsdp_config": {"reshard_after_forwad": True}},
     "fsdp_config.reshard_after_forwad", "did you mean 'reshard_after_forward'"),
    ({"fsdp_version": 2, "fp16": True}, "fp16", "use bf16: true with FSDP"),
    ({"fsdp_version": 3}, "fsdp_version", "must be 2 (FSDP2, recommended) or 1"),
    ({"fsdp": ["full_shard", "zero3"]}, "fsdp", "unknown item 'zero3'"),
    ({"fsdp_version": 2, "dp_shard_size": 2, "dp_replicate_size": 2}, "dp_replicate_size, dp_shard_size", "to 4"),
]  # fmt: skip


@pytest.mark.parametrize(("keys", "path", "fragment"), BAD, ids=[f"{i}-{case[1]}" for i, case in enumerate(BAD)])
def test_bad_fsdp_input_stops_run_before_any_rank(keys, path, fragment, write, capsys, tmp_path) -> None:
    code, out, err = run_cli(capsys, "run", write(**keys), "--nproc-per-node", "2")
    assert code == 2, out + err
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert any(line.startswith(f"  - {path}:") and fragment in line for line in problems), err
    assert "Traceback" not in err
    assert not (tmp_path / "out").exists()  # stopped before the run directory and the ranks


# Axolotl's spellings: each refused one is one problem line naming the key and what to write instead
AXOLOTL_BAD = [
    ({"fsdp_version": 2, "fsdp_config": {"sharding_strategy": "NO_SHARD"}},
     "fsdp_config.sharding_strategy", "NO_SHARD has no FSDP2 meaning: for plain data parallelism (DDP) remove"),
    ({"fsdp_version": 2, "fsdp_config": {"sharding_strategy": "SHARD_GRAD_OP", "reshard_after_forward": True}},
     "fsdp_config.sharding_strategy", "but fsdp_config.reshard_after_forward is true; remove sharding_strategy"),
    ({"fsdp_version": 2, "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD", "sharding_strategy": "SHARD_GRAD_OP"}},
     "fsdp_config.sharding_strategy", "but fsdp_config.fsdp_sharding_strategy says reshard_after_forward: true"),
    ({"fsdp_version": 1, "fsdp_config": {"fsdp_version": 2}},
     "fsdp_config.fsdp_version", "is 2 but fsdp_version is 1; write the version once, as the top-level"),
    ({"fsdp_config": {"fsdp_version": 2, "version": 1}},
     "fsdp_config.version", "is 1 but fsdp_config.fsdp_version is 2"),
    ({"fsdp_config": {"fsdp_version": 3}}, "fsdp_config.fsdp_version", "must be 2 (FSDP2, recommended) or 1"),
    ({"fsdp_version": 1, "fsdp_config": {"fsdp_reshard_after_forward": True}},
     "fsdp_config.fsdp_reshard_after_forward", "under fsdp_version: 1 write fsdp_sharding_strategy"),
    ({"fsdp_version": 1, "fsdp_config": {"fsdp_sharding_strategy": "FULL_SHARD", "sharding_strategy": "NO_SHARD"}},
     "fsdp_config.sharding_strategy", "is NO_SHARD but fsdp_config.fsdp_sharding_strategy is FULL_SHARD; keep one"),
]  # fmt: skip


@pytest.mark.parametrize(("keys", "path", "fragment"), AXOLOTL_BAD, ids=[f"{i}" for i in range(len(AXOLOTL_BAD))])
def test_a_refused_axolotl_spelling_is_one_line_and_exit_2(keys, path, fragment, write, capsys, tmp_path) -> None:
    code, out, err = run_cli(capsys, "run", write(**keys), "--nproc-per-node", "2")
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert code == 2 and "Traceback" not in err, out + err
    assert len(problems) == 1 and problems[0].startswith(f"  - {path}: ") and fragment in problems[0], err
    assert not (tmp_path / "out").exists()


# Each FSDP1 spelling under fsdp_version: 2: (key, value, what the one note shows, the options it resolves to)
TRANSLATED = [
    ("sharding_strategy", "FULL_SHARD", "`fsdp_config.reshard_after_forward: true`", {"reshard_after_forward": True}),
    ("sharding_strategy", "SHARD_GRAD_OP", "`fsdp_config.reshard_after_forward: false`",
     {"reshard_after_forward": False, "sharding_strategy": "SHARD_GRAD_OP"}),
    ("fsdp_sharding_strategy", "SHARD_GRAD_OP", "`fsdp_config.reshard_after_forward: false`",
     {"reshard_after_forward": False}),
    ("fsdp_reshard_after_forward", False, "`fsdp_config.reshard_after_forward: false`",
     {"reshard_after_forward": False}),
    ("fsdp_offload_params", True, "`fsdp_config.offload_params: true`", {"offload_params": True}),
    ("fsdp_state_dict_type", "FULL_STATE_DICT", "`fsdp_config.state_dict_type: FULL_STATE_DICT`",
     {"state_dict_type": "FULL_STATE_DICT"}),
    ("fsdp_auto_wrap_policy", "NO_WRAP", "`fsdp_config.auto_wrap_policy: NO_WRAP`", {"auto_wrap_policy": "NO_WRAP"}),
    ("fsdp_transformer_layer_cls_to_wrap", "LlamaDecoderLayer",
     "`fsdp_config.transformer_layer_cls_to_wrap: LlamaDecoderLayer`", {"layer_classes": ("LlamaDecoderLayer",)}),
    ("fsdp_cpu_ram_efficient_loading", True, "`fsdp_config.cpu_ram_efficient_loading: true`",
     {"cpu_ram_efficient_loading": True}),
    ("fsdp_activation_checkpointing", True, "`fsdp_config.activation_checkpointing: true`",
     {"activation_checkpointing": True}),
    ("fsdp_use_orig_params", False, "no FSDP2 meaning", {"use_orig_params": True}),
    ("fsdp_sync_module_states", True, "no FSDP2 meaning", {}),
    ("fsdp_limit_all_gathers", True, "no FSDP2 meaning", {}),
    ("fsdp_backward_prefetch", "BACKWARD_PRE", "no FSDP2 meaning", {}),
    ("fsdp_forward_prefetch", True, "no FSDP2 meaning", {"forward_prefetch": False}),
]  # fmt: skip


@pytest.mark.parametrize(
    ("name", "value", "spelling", "resolved"), TRANSLATED, ids=[f"{c[0]}-{c[1]}" for c in TRANSLATED]
)
def test_each_fsdp1_spelling_under_fsdp2_translates_with_one_note(
    name, value, spelling, resolved, write, capsys
) -> None:
    config = write(fsdp_version=2, fsdp_config={name: value})
    code, out, err = run_cli(capsys, "check", config)
    assert code == 0, err
    (note,) = [line for line in out.splitlines() if line.startswith("warning: fsdp")]
    assert note.startswith(f"warning: fsdp_config.{name}: FSDP1 ") and spelling in note, note
    options = options_of(config)
    assert {k: getattr(options, k) for k in resolved} == resolved and options.version == 2


@pytest.mark.parametrize("inner", ["fsdp_version", "version"])
def test_fsdp_version_inside_fsdp_config_is_the_top_level_key(inner: str, write, capsys) -> None:
    config = write(fsdp_config={inner: 2, "sharding_strategy": "FULL_SHARD", "offload_params": False})
    code, out, err = run_cli(capsys, "check", config)
    assert code == 0, err
    notes = [line for line in out.splitlines() if line.startswith("warning: fsdp")]
    assert len(notes) == 2 and "not set, so FSDP1" not in out, notes
    assert f"warning: fsdp_config.{inner}: read as the top-level `fsdp_version: 2`" in notes[0]
    assert notes[1].startswith("warning: fsdp_config.sharding_strategy: FSDP1 spelling under fsdp_version: 2")
    assert options_of(config) == FsdpOptions(version=2)
    same = write(fsdp_version=2, fsdp_config={inner: 2})
    code, out, err = run_cli(capsys, "check", same)
    assert code == 0 and f"warning: fsdp_config.{inner}: repeats fsdp_version: 2; remove it" in out, out + err


def test_axolotl_fsdp2_example_config_passes_with_one_note_per_fsdp1_key(sets: list[str], capsys) -> None:
    """The shape of Axolotl's FSDP2 examples: the version inside fsdp_config, FSDP1 prefixes, FSDP1 tuning keys."""
    code, out, err = run_cli(capsys, "check", HERE / "fixtures" / "axolotl_fsdp2.yaml", *sets)
    assert code == 0, err
    notes = sorted(line.split(":")[1].strip() for line in out.splitlines() if line.startswith("warning: fsdp"))
    assert notes == [
        "fsdp_config.fsdp_limit_all_gathers",
        "fsdp_config.fsdp_sync_module_states",
        "fsdp_config.fsdp_use_orig_params",
        "fsdp_config.fsdp_version",
        "fsdp_config.sharding_strategy",
    ], out
    options = options_of(HERE / "fixtures" / "axolotl_fsdp2.yaml", *sets[1::2])
    assert options == options_of(SEED / "fsdp2.yaml", *sets[1::2])


def test_migrate_moves_the_inner_version_to_the_top_level(tmp_path: Path, sets: list[str], capsys) -> None:
    config = tmp_path / "axolotl_fsdp2.yaml"
    shutil.copy(HERE / "fixtures" / "axolotl_fsdp2.yaml", config)
    code, out, err = run_cli(capsys, "migrate", config)
    assert code == 0 and "fsdp_config.fsdp_version: moved to the top level" in out, out + err
    migrated = yaml.safe_load(config.read_text())
    assert migrated["fsdp_version"] == 2 and "fsdp_version" not in migrated["fsdp_config"]
    code, out, err = run_cli(capsys, "check", config, *sets)
    assert code == 0 and "warning" not in out, out + err


def test_hybrid_shard_with_replicas_and_the_list_form_are_notes(write, capsys) -> None:
    config = write(
        fsdp_version=2, dp_replicate_size=2, fsdp=["hybrid_shard", "auto_wrap"], fsdp_config={"offload_params": False}
    )
    code, out, err = run_cli(capsys, "check", config, "--world-size", "4")
    assert code == 0, err
    assert (
        "warning: fsdp: FSDP1 spelling under fsdp_version: 2; FSDP2 writes `fsdp_config.reshard_after_forward: true`"
        in out
    )
    assert "dp_replicate 2 x dp_shard 2" in out
    options = options_of(config)
    assert (options.sharding_strategy, options.reshard_after_forward) == ("HYBRID_SHARD", True)


def test_fsdp_and_deepspeed_in_one_config_name_both(write, capsys) -> None:
    """The kernel's role check: two plugins claim ``sharding``. The real DeepSpeed plugin when installed."""
    try:
        importlib.metadata.distribution("ktrain-plugin-deepspeed")
        extra: list = []
    except importlib.metadata.PackageNotFoundError:  # a stand-in with DeepSpeed's key and roles
        section = attrs.make_class("DeepSpeedKeys", {"deepspeed": attrs.field(default=None)})
        stand_in = types.ModuleType("deepspeed_stand_in")
        stand_in.ktrain_register_config = hookimpl(lambda register: register(section))
        stand_in.ktrain_activate = hookimpl(
            lambda config, activate: (
                activate(object(), roles=("sharding", "checkpoint_format"), keys=("deepspeed",))
                if config.deepspeed
                else None
            )
        )
        extra = [("deepspeed", stand_in)]
    config = write(fsdp_version=2, deepspeed={"zero_optimization": {"stage": 3}})
    with pytest.raises(PluginError) as info:
        prepare(config, extra_plugins=extra)
    message = str(info.value)
    assert "two plugins claim the role 'sharding'" in message
    assert "'fsdp' (ktrain-plugin-fsdp" in message and "enabled by: fsdp_version" in message
    assert "enabled by: deepspeed" in message


def test_check_with_fsdp_keys_imports_no_torch(sets: list[str]) -> None:
    code = (
        "import sys; from ktrain.cli import main; "
        f"code = main(['check', {str(SEED / 'fsdp2.yaml')!r}, *{sets!r}]); "
        "sys.exit(code or 3 * ('torch' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


# ---------------------------------------------------------------------------------------------------
# What needs the model or torch: wrapped classes, mixed precision
# ---------------------------------------------------------------------------------------------------


def test_a_layer_class_the_model_lacks_lists_the_classes_it_has(tiny_model_dir: Path) -> None:
    from ktrain_fsdp.sharding import layer_classes

    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(tiny_model_dir))
    assert layer_classes(model, FsdpOptions(version=2)) == (type(model.model.layers[0]),)
    with pytest.raises(ConfigError) as info:
        layer_classes(model, FsdpOptions(version=1, layer_classes=("Qwen2DecoderLayer",)))
    (problem,) = info.value.report.errors
    assert problem.path == "fsdp_config.fsdp_transformer_layer_cls_to_wrap"
    assert "has no Qwen2DecoderLayer" in problem.message and "LlamaDecoderLayer" in problem.message


def test_a_layer_class_a_local_model_lacks_stops_check(write, capsys) -> None:
    """Before launch, from the local model's config.json and transformers' modeling source: exit 2."""
    config = write(fsdp_version=2, fsdp_config={"transformer_layer_cls_to_wrap": "Qwen2DecoderLayer"})
    code, _, err = run_cli(capsys, "check", config, "--world-size", "2")
    assert code == 2, err
    assert "fsdp_config.transformer_layer_cls_to_wrap" in err and "has no Qwen2DecoderLayer" in err
    assert "LlamaDecoderLayer" in err


def test_mixed_precision_is_compute_dtype_parameters_and_fp32_reductions() -> None:
    from ktrain_fsdp import fsdp1, fsdp2

    policy = fsdp2.mixed_precision(torch.bfloat16)
    assert (policy.param_dtype, policy.reduce_dtype) == (torch.bfloat16, torch.float32)
    assert fsdp2.mixed_precision(torch.float32).param_dtype is None  # fp32: parameters as stored
    legacy = fsdp1.mixed_precision(torch.bfloat16)
    assert (legacy.param_dtype, legacy.reduce_dtype, legacy.buffer_dtype) == (torch.bfloat16,) + (torch.float32,) * 2
    assert fsdp1.mixed_precision(torch.float32) is None


# ---------------------------------------------------------------------------------------------------
# ktrain migrate
# ---------------------------------------------------------------------------------------------------


def test_migrate_rewrites_fsdp1_seed_config_keeping_comments(tmp_path: Path, sets: list[str], capsys) -> None:
    config = tmp_path / "fsdp1.yaml"
    shutil.copy(SEED / "fsdp1.yaml", config)
    before = config.read_text()
    code, out, _ = run_cli(capsys, "migrate", config, "--dry-run")
    assert code == 0 and config.read_text() == before
    code, out, err = run_cli(capsys, "migrate", config)
    assert code == 0, err
    assert "-fsdp_version: 1\n+fsdp_version: 2\n" in out
    assert "\n-  fsdp_sharding_strategy: FULL_SHARD\n" in out and "\n+  reshard_after_forward: true\n" in out
    assert "alpaca" not in out  # only the migrated lines differ
    after = config.read_text()
    assert after.count("#") == before.count("#") == 3 and after.startswith("# FSDP1, the form")
    assert "fsdp_" not in after.split("fsdp_config:")[1]
    code, out, err = run_cli(capsys, "check", config, *sets)
    assert code == 0 and "warning" not in out, out + err
    assert options_of(config, *sets[1::2]) == options_of(SEED / "fsdp2.yaml", *sets[1::2])
    code, out, _ = run_cli(capsys, "migrate", config)
    assert code == 0 and "already an FSDP2 config" in out


def test_migrate_removes_keys_without_meaning_and_needs_replicas_for_hybrid(tmp_path: Path, capsys) -> None:
    config = tmp_path / "run.yaml"
    text = (
        "fsdp:\n  - hybrid_shard\n  - auto_wrap\n"
        "fsdp_config:\n"
        "  fsdp_offload_params: false  # stay on the GPU\n"
        "  fsdp_backward_prefetch: BACKWARD_PRE\n"
        "  fsdp_use_orig_params: true\n"
    )
    config.write_text(text)
    code, _, err = run_cli(capsys, "migrate", config)
    assert code == 2 and "--dp-replicate-size" in err and config.read_text() == text
    code, out, err = run_cli(capsys, "migrate", config, "--dp-replicate-size", "2")
    assert code == 0, err
    assert "fsdp_config.fsdp_backward_prefetch: removed, it has no FSDP2 meaning" in out
    migrated = yaml.safe_load(config.read_text())
    assert migrated == {
        "dp_replicate_size": 2,
        "fsdp_version": 2,
        "fsdp_config": {
            "offload_params": False,
            "reshard_after_forward": True,
            "auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
        },
    }
    assert re.search(r"\n  offload_params: false +# stay on the GPU\n", config.read_text())
    config.write_text("fsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n")
    code, _, err = run_cli(capsys, "migrate", config)
    assert code == 2 and "NO_SHARD has no FSDP2 meaning" in err
    assert config.read_text() == "fsdp_config:\n  fsdp_sharding_strategy: NO_SHARD\n"
