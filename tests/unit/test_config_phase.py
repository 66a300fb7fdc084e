"""The config phase (``ktrain check``, and ``ktrain run`` before any rank starts): no runtime module and no torch
imported for any first-party plugin, a plugin's missing requirement as one line with its install command, and every
stage's problems in one report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
import yaml

from ktrain import hookimpl
from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from tests.kit import QUICKSTART, REPO

# plugin -> the keys that enable it (beside the quick start's model and data)
ENABLING: dict[str, dict[str, object]] = {
    "compile": {"torch_compile": True},
    "fsdp": {"fsdp_version": 2, "fsdp_config": {"reshard_after_forward": True}},
    "lora": {"adapter": "lora", "lora_r": 4, "lora_alpha": 8, "lora_target_modules": ["q_proj", "v_proj"]},
    "parallel": {"tensor_parallel_size": 2, "fsdp_version": 2},
    "optimizers": {"optimizer": "adamw_bnb_8bit"},
    "wandb": {"wandb_project": "p", "wandb_mode": "offline"},
    "mlflow": {"mlflow_tracking_uri": "file:///nowhere"},
    "fused_loss": {"fused_linear_cross_entropy": True},
    "liger": {"liger_rms_norm": True},
    "fp8": {"fp8": True},
    "needy": {"needy": True},  # an installed plugin whose distribution requires a package that is not installed
    # last: DeepSpeed's own parser checks the JSON before any rank starts, and imports torch with DeepSpeed
    "deepspeed": {"deepspeed": str(REPO / "tests" / "fixtures" / "deepspeed" / "zero2.json")},
}
RUNTIME_MODULES = ("runtime", "tracker", "note", "loading")
HEAVY = ("torch", "deepspeed", "peft", "transformers", "bitsandbytes", "torchao", "liger_kernel", "wandb", "mlflow")

# Runs ``ktrain check`` on each config in turn, in one process, and prints what each one newly imported.
PROBE = """
import contextlib, io, json, sys
from ktrain.cli import _main
found = {}
for name, path in json.loads(sys.argv[1]).items():
    before, err = set(sys.modules), io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        code = _main(["check", path])
    found[name] = {"code": code, "stderr": err.getvalue(), "imported": sorted(set(sys.modules) - before)}
print(json.dumps(found))
"""

NEEDY = """
import attrs
from ktrain import hookimpl

@attrs.define(kw_only=True)
class Keys:
    needy: bool = attrs.field(default=False, metadata={"help": "turn on"})

@hookimpl
def ktrain_register_config(register):
    register(Keys)

@hookimpl
def ktrain_activate(config, activate):
    if config.needy:
        activate("needy_runtime:Needy", keys=("needy",))
"""


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    """What ``ktrain check`` of a config enabling each plugin printed, returned and imported."""
    root = tmp_path_factory.mktemp("config_phase")
    site = root / "site"
    site.mkdir()
    (site / "needy_entry.py").write_text(NEEDY, encoding="utf-8")
    (site / "needy_runtime.py").write_text("import no_such_package_anywhere\n\nNeedy = object\n", encoding="utf-8")
    info = site / "ktrain_plugin_needy-0.3.dist-info"
    info.mkdir()
    metadata = "Metadata-Version: 2.1\nName: ktrain-plugin-needy\nVersion: 0.3\n"
    metadata += "Requires-Dist: ktrain-llm\nRequires-Dist: no-such-package-anywhere>=2\n"
    metadata += 'Requires-Dist: no-such-extra; extra == "more"\n'
    (info / "METADATA").write_text(metadata, encoding="utf-8")
    (info / "entry_points.txt").write_text("[ktrain]\nneedy = needy_entry\n", encoding="utf-8")
    base = {
        "base_model": str(QUICKSTART / "model"),
        "random_init_weights": True,
        "datasets": [{"path": str(QUICKSTART / "data" / "train.jsonl"), "type": "chat_template"}],
        "micro_batch_size": 2,
        "output_dir": str(root / "out"),
    }
    configs = {}
    for name, keys in ENABLING.items():
        configs[name] = str(root / f"{name}.yaml")
        Path(configs[name]).write_text(yaml.safe_dump({**base, **keys}), encoding="utf-8")
    path = [str(site), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    done = subprocess.run(
        [sys.executable, "-c", PROBE, json.dumps(configs)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(path)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.parametrize("plugin", [name for name in ENABLING if name != "needy"])
def test_check_imports_no_runtime_module_and_no_torch(checked: dict[str, dict], plugin: str) -> None:
    result = checked[plugin]
    assert result["code"] == 0, result["stderr"]
    runtime = [m for m in result["imported"] if m.startswith("ktrain_") and m.endswith(RUNTIME_MODULES)]
    assert runtime == [], f"ktrain check imported {runtime}"
    heavy = [m for m in result["imported"] if m.split(".")[0] in HEAVY]
    if plugin == "deepspeed":  # DeepSpeed's parser of the JSON, not the plugin's runtime
        heavy = [m for m in heavy if m.split(".")[0] not in ("deepspeed", "torch", "mlflow", "transformers")]
    assert heavy == [], f"ktrain check imported {sorted({m.split('.')[0] for m in heavy})}"


def test_a_missing_requirement_is_one_line_with_the_install_command(checked: dict[str, dict]) -> None:
    result = checked["needy"]
    assert result["code"] == 2
    assert result["stderr"] == (
        "ktrain: the plugin 'needy' (ktrain-plugin-needy 0.3) (enabled by needy) needs no-such-package-anywhere>=2, "
        "which is not installed: `pip install 'no-such-package-anywhere>=2'`\n"
    )


def _plugin(name: str, **hooks: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for hook, function in hooks.items():
        setattr(module, hook, hookimpl(function))
    return module


def test_a_role_conflict_and_an_unknown_key_hide_no_plugin_check(tiny_config) -> None:
    """A role claimed twice, an unknown key and a plugin's own check: one report names all three."""

    def claim(config, activate):
        activate(types.SimpleNamespace(), roles=("sharding",), keys=("adapter",))

    def check(config, report):
        report.error("lora_r", "is checked although the roles clash")

    plugins = [("first", _plugin("first", ktrain_activate=claim)), ("second", _plugin("second", ktrain_activate=claim))]
    plugins.append(("checker", _plugin("checker", ktrain_validate_config=check)))
    with pytest.raises(ConfigError) as info:
        prepare(tiny_config(learning_rat=0.1), extra_plugins=plugins)
    message = str(info.value)
    assert "learning_rat" in message
    assert "two plugins claim the role 'sharding'" in message
    assert "lora_r: is checked although the roles clash" in message
