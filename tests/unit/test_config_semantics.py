"""What the config phase means by null, by a path, by a problem, and what it tells the user to do.

Null is "not set" everywhere; a dataset is a local file or folder or a Hub id (tests/integration/test_data_hub.py), a
model a local folder with weights or a Hub id; ``check`` refuses what ``run`` would refuse; every stage's
problems are reported together; a validator's message names its key; install hints are commands that work
here; ``ktrain keys`` starts with the kernel's keys.
"""

from __future__ import annotations

import json
import subprocess
import sys
import types
from pathlib import Path

import attrs
import pytest

import ktrain
from ktrain import hookimpl
from ktrain.cli import EXIT_BAD_INPUT, EXIT_OK, main
from ktrain.config.install import install_command
from ktrain.config.keys import KERNEL_SECTIONS, key
from ktrain.config.launch import Launch
from ktrain.config.load import Section, load_config
from ktrain.config.paths import looks_local
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError

REPO = Path(ktrain.__file__).resolve().parents[2]


def check(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    code = main(["check", *map(str, args)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def write(tmp_path: Path, text: str, model: Path, data: Path) -> Path:
    path = tmp_path / "config.yaml"
    body = text.replace("@MODEL@", json.dumps(str(model))).replace("@DATA@", json.dumps(str(data)))
    path.write_text(body.replace("@OUT@", json.dumps(str(tmp_path / "out"))), encoding="utf-8")
    return path


BASE = "base_model: @MODEL@\ndatasets:\n  - path: @DATA@\n    type: chat_template\noutput_dir: @OUT@\n"


def plugin(name: str, **hooks: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook_name, function in hooks.items():
        setattr(module, hook_name, hookimpl(function))
    return module


# ---------------------------------------------------------------------------------------------------
# null means unset
# ---------------------------------------------------------------------------------------------------


def test_null_keys_hold_their_default_and_enable_no_plugin(tmp_path, tiny_model_dir, tiny_chat_jsonl, capsys) -> None:
    text = BASE.replace("    type: chat_template\n", "    type: chat_template\n    split:\n")
    text += "fsdp:\nfsdp_config:\nfp16:\nhub_model_id:\nmax_grad_norm:\n"
    config = write(tmp_path, text, tiny_model_dir, tiny_chat_jsonl)
    code, out, err = check(capsys, config, "--set", "bf16=null")
    assert code == EXIT_OK, err
    assert "enabled by fsdp" not in out
    assert "sharding: kernel default" in out
    assert f"fp16 = False    [kernel; {config}:9, null: unset]" in out
    assert "bf16 = False    [kernel; --set, null: unset]" in out
    assert f"hub_model_id    [no installed plugin; {config}:10, null: unset]" in out
    plan = prepare(config)
    assert not plan.config.is_set("fsdp_config") and not plan.config.is_set("fp16")
    assert plan.config.datasets[0].split == "train"
    assert plan.config.max_grad_norm == 1.0


def test_null_keys_of_plugins_that_are_not_installed_are_accepted(tmp_path, tiny_model_dir, tiny_chat_jsonl) -> None:
    config = write(tmp_path, BASE + "lora_r:\ndeepspeed:\nliger_rms_norm: true\n", tiny_model_dir, tiny_chat_jsonl)
    sections = [Section(cls, "kernel") for cls in KERNEL_SECTIONS]
    with pytest.raises(ConfigError) as info:
        load_config(config, [], sections, installed=set())
    assert [p.path for p in info.value.report.errors] == ["liger_rms_norm"]


# ---------------------------------------------------------------------------------------------------
# paths: what check refuses, run refuses
# ---------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "local"),
    [
        ("data/nope.jsonl", True),
        ("nope.parquet", True),
        ("./nope", True),
        ("/abs/nope", True),
        ("~/nope", True),
        ("data/sub/nope", True),
        ("data/", True),
        ("my data/x", True),
        ("tatsu-lab/alpaca", False),
        ("Qwen/Qwen2.5-0.5B", False),
        ("gpt2", False),
    ],
)
def test_local_paths_and_hub_ids(name: str, local: bool) -> None:
    assert looks_local(name) is local


def test_a_local_dataset_that_is_not_here_is_a_check_error(
    tmp_path, tiny_model_dir, tiny_chat_jsonl, capsys, monkeypatch
) -> None:
    monkeypatch.chdir(tmp_path)
    config = write(tmp_path, BASE, tiny_model_dir, tiny_chat_jsonl)
    code, _, err = check(capsys, config, "--set", "datasets.0.path=data/nope.jsonl")
    assert code == EXIT_BAD_INPUT
    assert "  - datasets[0].path: data/nope.jsonl does not exist" in err


def test_a_model_folder_without_weights_is_a_check_error(tmp_path, tiny_model_dir, tiny_chat_jsonl, capsys) -> None:
    bare = tmp_path / "bare-model"
    bare.mkdir()
    (bare / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    config = write(tmp_path, BASE, bare, tiny_chat_jsonl)
    code, _, err = check(capsys, config)
    assert code == EXIT_BAD_INPUT
    assert f"base_model: {bare} holds config.json but no weights" in err
    code, _, err = check(capsys, config, "--set", "random_init_weights=true")
    assert code == EXIT_OK, err


def test_a_hub_model_is_shown_and_not_contacted(tmp_path, tiny_chat_jsonl, capsys, monkeypatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    config = write(tmp_path, BASE, Path("Qwen/Qwen2.5-0.5B"), tiny_chat_jsonl)
    code, out, err = check(capsys, config)
    assert code == EXIT_OK, err
    assert "  base_model: Qwen/Qwen2.5-0.5B" in out


# ---------------------------------------------------------------------------------------------------
# every stage's problems at once
# ---------------------------------------------------------------------------------------------------


def test_unknown_keys_do_not_hide_the_later_stages(tmp_path, tiny_model_dir, tiny_chat_jsonl, capsys) -> None:
    text = BASE + "micro_batch_sise: 2\nmicro_batch_size: 0\noptimizer: adamw9\ndp_replicate_size: 3\n"
    config = write(tmp_path, text, tiny_model_dir, tiny_chat_jsonl)
    code, _, err = check(capsys, config, "--world-size", "4")
    assert code == EXIT_BAD_INPUT
    assert "4 problem(s)" in err
    for path in ("micro_batch_sise:", "micro_batch_size:", "optimizer:", "dp_replicate_size:"):
        assert f"  - {path}" in err


def test_a_refused_value_brings_no_follow_up_problems(tmp_path, tiny_model_dir, tiny_chat_jsonl, capsys) -> None:
    text = "base_model: @MODEL@\noutput_dir: @OUT@\ndatasets: {path: x}\nmicro_batch_size: 0\n"
    code, _, err = check(capsys, write(tmp_path, text, tiny_model_dir, tiny_chat_jsonl))
    assert code == EXIT_BAD_INPUT
    assert "2 problem(s)" in err and "datasets: expected a list" in err and "micro_batch_size:" in err


def test_a_role_conflict_ends_it_with_the_problems_found_before(tiny_config) -> None:
    def claiming(name: str, switch: str) -> tuple[str, types.ModuleType]:
        section = attrs.make_class(f"{name}Keys", {switch: key(False, "on")})

        def ktrain_activate(config, activate):
            if getattr(config, switch):
                activate(types.SimpleNamespace(), roles=("sharding",), keys=(switch,))

        return name, plugin(
            name, ktrain_register_config=lambda register: register(section), ktrain_activate=ktrain_activate
        )

    plugins = [claiming("one", "shard_one"), claiming("two", "shard_two")]
    with pytest.raises(ConfigError) as info:
        prepare(tiny_config(shard_one=True, shard_two=True, micro_batch_sise=2), extra_plugins=plugins)
    text = str(info.value)
    assert "micro_batch_sise: unknown key" in text and "two plugins claim the role 'sharding'" in text


# ---------------------------------------------------------------------------------------------------
# validators, launch, install hints, keys
# ---------------------------------------------------------------------------------------------------


def test_a_validator_names_its_key(tiny_config) -> None:
    @attrs.define(kw_only=True)
    class RankKeys:
        rank_count: int = key(1, "ranks", validator=attrs.validators.ge(1))

    ranks = plugin("ranks", ktrain_register_config=lambda register: register(RankKeys))
    with pytest.raises(ConfigError) as info:
        prepare(tiny_config(rank_count=0, micro_batch_size=0), extra_plugins=[("ranks", ranks)])
    assert "  - rank_count: must be >= 1: 0" in str(info.value)
    assert "  - micro_batch_size:" in str(info.value)


def test_validate_config_sees_the_launch(tiny_config) -> None:
    seen: list[Launch | None] = []
    spy = plugin("spy", ktrain_validate_config=lambda launch: seen.append(launch))
    prepare(tiny_config(), extra_plugins=[("spy", spy)])
    prepare(tiny_config(), world_size=2, extra_plugins=[("spy", spy)])
    prepare(tiny_config(), device="cpu", extra_plugins=[("spy", spy)])
    assert seen == [None, Launch(world_size=2, device=None), Launch(world_size=1, device="cpu")]


def test_install_hints_work_from_this_checkout(tiny_config) -> None:
    assert install_command("ktrain-plugin-liger") == f"pip install -e {REPO / 'plugins' / 'liger'}"
    assert install_command("ktrain-plugin-nowhere") == "pip install ktrain-plugin-nowhere"
    sections = [Section(cls, "kernel") for cls in KERNEL_SECTIONS]
    with pytest.raises(ConfigError) as info:
        load_config(tiny_config(liger_rms_norm=True), [], sections, installed=set())
    assert f"`pip install -e {REPO / 'plugins' / 'liger'}`" in str(info.value)


def test_keys_start_with_the_kernel_and_list_registered_names() -> None:
    done = subprocess.run([sys.executable, "-m", "ktrain.cli", "keys"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    headers = [line for line in done.stdout.splitlines() if not line.startswith(" ")]
    owners = [line.rsplit("(", 1)[1].rstrip("):") for line in headers]
    kernel = [o for o in owners if o == "kernel"]
    assert owners[: len(kernel)] == kernel and owners[len(kernel) :] == sorted(owners[len(kernel) :])
    lines = done.stdout.splitlines()
    after = lines[lines.index(next(line for line in lines if line.startswith("  optimizer = "))) + 1]
    assert after.startswith("    one of: ") and "adamw_torch" in after


def test_the_validator_example_of_writing_plugins_works(tiny_config) -> None:
    text = (REPO / "docs" / "writing-plugins.md").read_text(encoding="utf-8")
    block = (
        text.split("<!-- file: ktrain-plugin-gradsync/ktrain_gradsync/bucket_keys.py -->", 1)[1]
        .split("```python\n", 1)[1]
        .split("```", 1)[0]
    )
    namespace: dict = {}
    exec(compile(block, "writing-plugins.md", "exec"), namespace)
    section = namespace["BucketKeys"]
    buckets = plugin("buckets", ktrain_register_config=lambda register: register(section))
    with pytest.raises(ConfigError) as info:
        prepare(tiny_config(bucket_mb=0, bucket_count=3), extra_plugins=[("buckets", buckets)])
    assert "  - bucket_mb: must be >= 1: 0" in str(info.value)
    assert "  - bucket_count: must be a power of two, not 3" in str(info.value)
    assert prepare(tiny_config(bucket_count=8), extra_plugins=[("buckets", buckets)]).config.bucket_count == 8
