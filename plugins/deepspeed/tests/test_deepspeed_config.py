"""``deepspeed:`` before any rank starts: files, presets, "auto", contradictions, DeepSpeed's own check, fetch.

Everything here runs the real ``ktrain check`` / ``ktrain fetch`` in process, with the installed plugin and
the installed DeepSpeed; no training.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import subprocess
import sys
import types
from pathlib import Path

import attrs
import pytest

from ktrain import hookimpl
from ktrain.cli import main
from ktrain.config.plan import load_plugins_and_config
from ktrain_deepspeed import links
from ktrain_deepspeed.accelerator import load_deepspeed
from ktrain_deepspeed.presets import PRESET_DIR, preset_names
from tests.kit import REPO

COMPAT = REPO / "tests" / "fixtures" / "deepspeed"
BF16_FILES = {"zero3_bf16.json", "zero3_bf16_cpuoffload_all.json", "zero3_bf16_cpuoffload_params.json"}


@pytest.fixture
def config(tiny_config):
    """Write a run config with ``keys`` over the tiny model and data; return its path."""
    return tiny_config


def check(capsys, path: Path, *args: str) -> tuple[int, list[str], list[str]]:
    """``ktrain check``: exit code, the problem lines and the warning lines it printed."""
    code = main(["check", str(path), *args])
    out, err = capsys.readouterr()
    problems = [line[4:] for line in err.splitlines() if line.startswith("  - ")]
    warnings = [line for line in (out + err).splitlines() if "warning:" in line]
    assert code in (0, 2), err
    return code, problems, warnings


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data, indent=2), encoding="utf-8")
    return path


def test_json_that_does_not_parse_names_file_line_and_column(config, tmp_path, capsys) -> None:
    bad = tmp_path / "broken.json"
    bad.write_text('{\n  "zero_optimization": {\n    "stage": 2,\n  }\n}\n', encoding="utf-8")
    code, problems, _ = check(capsys, config(deepspeed=str(bad)))
    assert code == 2
    assert problems == [f"deepspeed: {bad}, line 4, column 3: Expecting property name enclosed in double quotes"]


def test_unknown_keys_are_named_with_deepspeeds_own_message(config, tmp_path, capsys) -> None:
    path = write_json(
        tmp_path / "typos.json",
        {
            "zero_optimization": {"stage": 2, "stagee": 3},
            "bf16": {"enabled": "auto", "enable": True},
            "gradient_acumulation_steps": 4,
        },
    )
    code, problems, _ = check(capsys, config(deepspeed=str(path)))
    assert code == 2
    version = f"DeepSpeed {importlib.metadata.version('deepspeed')}"
    assert sorted(problems) == sorted(
        [
            f"deepspeed.zero_optimization.stagee: Extra inputs are not permitted ({version}), in {path}",
            f"deepspeed.bf16.enable: Extra inputs are not permitted ({version}), in {path}",
            f"deepspeed.gradient_acumulation_steps: {version} does not read this key, so it would be ignored; "
            f"did you mean 'gradient_accumulation_steps'? fix or remove it, in {path}",
        ]
    )


def test_a_value_that_contradicts_a_ktrain_key_names_both_places(config, tmp_path, capsys) -> None:
    path = write_json(
        tmp_path / "mine.json",
        {
            "zero_optimization": {"stage": 3, "allgather_bucket_size": "auto"},
            "gradient_accumulation_steps": 4,
            "gradient_clipping": 1.0,
            "bf16": {"enabled": True},
            "train_micro_batch_size_per_gpu": "auto",
        },
    )
    code, problems, _ = check(capsys, config(deepspeed=str(path), gradient_accumulation_steps=8))
    assert code == 2
    agree = 'write "auto" in the JSON (ktrain fills it) or make the two agree'
    gas = "gradient_accumulation_steps"
    assert f"deepspeed.{gas}: is 4 in {path}, but {gas} is 8 in the config; {agree}" in problems
    assert f"deepspeed.bf16.enabled: is true in {path}, but bf16 is false by default; {agree}" in problems
    assert any(p.startswith('deepspeed.zero_optimization.allgather_bucket_size: is "auto"') for p in problems)
    assert len(problems) == 3, problems  # gradient_clipping 1.0 agrees with max_grad_norm's default


def test_auto_and_absent_settings_are_filled_from_ktrain_keys(config, tmp_path) -> None:
    """On a rank: "auto" and the settings the JSON leaves out take ktrain's values, bucket sizes the hidden size's."""
    path = config(micro_batch_size=3, gradient_accumulation_steps=4, max_grad_norm=0, learning_rate=1e-4, bf16=True)
    _, loaded = load_plugins_and_config(path, [])
    settings = json.loads((COMPAT / "zero3.json").read_text())
    settings["optimizer"] = {"type": "AdamW", "params": {"lr": "auto"}}
    del settings["gradient_clipping"]
    filled = links.fill(settings, loaded, links.Facts(dp_size=2, hidden_size=16, bf16=True, total_steps=10))
    assert filled["train_micro_batch_size_per_gpu"] == 3
    assert filled["gradient_accumulation_steps"] == 4
    assert filled["train_batch_size"] == 3 * 4 * 2
    assert filled["gradient_clipping"] == 0.0  # max_grad_norm: 0
    assert (filled["bf16"]["enabled"], filled["fp16"]["enabled"]) == (True, False)
    assert filled["optimizer"]["params"] == {"lr": 1e-4, "betas": [0.9, 0.999], "eps": 1e-8, "weight_decay": 0.0}
    zero = filled["zero_optimization"]
    assert (zero["reduce_bucket_size"], zero["stage3_prefetch_bucket_size"]) == (256, 230)
    assert zero["stage3_param_persistence_threshold"] == 160
    assert not list(links.autos(filled))
    # train_batch_size needs the number of ranks: a rank checks it before DeepSpeed starts
    (problem,) = links.check({"train_batch_size": 16}, loaded, links.Facts(dp_size=2), "mine.json")
    assert problem == (
        "train_batch_size",
        "is 16 in mine.json, but micro_batch_size x gradient_accumulation_steps x data-parallel ranks is 24 in "
        'the config; write "auto" in the JSON (ktrain fills it) or make the two agree',
    )


@pytest.mark.parametrize("name", sorted(p.name for p in COMPAT.glob("*.json")))
def test_every_reference_json_loads(name: str, config, capsys) -> None:
    """Axolotl's DeepSpeed JSON files as users have them: checked by ktrain and by DeepSpeed, no problem."""
    extra = {"bf16": True} if name in BF16_FILES else {}
    code, problems, warnings = check(capsys, config(deepspeed=str(COMPAT / name), **extra))
    assert (code, problems) == (0, [])
    if "torch_compile" in name:  # DeepSpeed's older compile keys, read as they were meant
        assert any("deepspeed.compile" in w and "torch.compile(backend='inductor')" in w for w in warnings)
    else:
        assert warnings == []


def test_presets_by_name_and_fetched(config, tmp_path, capsys, monkeypatch) -> None:
    assert preset_names() == [
        "zero1",
        "zero2",
        "zero3",
        "zero3_bf16",
        "zero3_bf16_cpuoffload_all",
        "zero3_bf16_cpuoffload_params",
    ]
    for name in preset_names():
        code, problems, _ = check(capsys, config(deepspeed=name, bf16=True))
        assert (code, problems) == (0, []), name
    code, problems, _ = check(capsys, config(deepspeed="zero5"))
    assert code == 2 and "'zero5' is neither a JSON file nor a preset; did you mean 'zero3'?" in problems[0]

    monkeypatch.chdir(tmp_path)
    seed_path = "deepspeed_configs/zero3_bf16.json"  # what Axolotl-style run configs name
    code, problems, _ = check(capsys, config(deepspeed=seed_path, bf16=True))
    assert code == 2 and "`ktrain fetch deepspeed_configs` writes the presets" in problems[0]
    assert main(["fetch", "deepspeed_configs"]) == 0
    assert "wrote 6 presets of ktrain-plugin-deepspeed" in capsys.readouterr().out
    fetched = tmp_path / "deepspeed_configs"
    assert {p.name: p.read_bytes() for p in fetched.iterdir()} == {p.name: p.read_bytes() for p in PRESET_DIR.iterdir()}
    code, problems, _ = check(capsys, config(deepspeed=seed_path, bf16=True))
    assert (code, problems) == (0, [])

    (fetched / "zero2.json").write_text("{}", encoding="utf-8")  # the user's edit is never overwritten quietly
    assert main(["fetch", "deepspeed_configs"]) == 2
    assert "zero2.json in deepspeed_configs differ from the presets; nothing written" in capsys.readouterr().err
    assert (fetched / "zero2.json").read_text() == "{}"
    assert main(["fetch", "deepspeed_configs", "--overwrite"]) == 0
    assert (fetched / "zero2.json").read_bytes() == (PRESET_DIR / "zero2.json").read_bytes()


def test_keys_that_do_not_fit_deepspeed(config, tmp_path, capsys) -> None:
    code, problems, _ = check(capsys, config(deepspeed="zero3", tensor_parallel_size=2))
    assert code == 2
    assert any(p.startswith("tensor_parallel_size: is 2, but DeepSpeed ZeRO shards over every rank") for p in problems)

    code, problems, _ = check(capsys, config(deepspeed="zero3_bf16_cpuoffload_all", bf16=True, optimizer="sgd"))
    assert code == 2
    assert problems == [
        "optimizer: is sgd, but the preset zero3_bf16_cpuoffload_all offloads the optimizer, which DeepSpeed steps "
        "with its CPU Adam (ktrain uses it for adamw_torch, adamw_torch_fused, adamw); choose one of those, or set "
        '"zero_force_ds_cpu_optimizer": false in the JSON to step sgd on the CPU'
    ]

    code, problems, _ = check(capsys, config(deepspeed="zero2", bfloat16=True))
    assert code == 2 and problems[0].startswith("bfloat16: pure bf16 weights are not ktrain's under deepspeed")

    stage0 = write_json(tmp_path / "stage0.json", {"bf16": {"enabled": "auto"}})
    code, problems, _ = check(capsys, config(deepspeed=str(stage0)))
    assert code == 2 and problems[0].startswith("deepspeed.zero_optimization.stage: ") and "1, 2 or 3" in problems[0]

    inline = {"zero_optimization": {"stage": 1}, "optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}
    code, problems, warnings = check(capsys, config(deepspeed=inline, optimizer="adamw_torch_fused"))
    assert (code, problems) == (0, [])
    idle = "optimizer: has no effect: the inline deepspeed mapping names its own optimizer (AdamW)"
    assert any(idle in w for w in warnings)


def test_what_this_machine_cannot_run_stops_before_the_ranks(config, tmp_path, capsys) -> None:
    """fp16 on an accelerator without it, NVMe offload without DeepSpeed's async_io op: as DeepSpeed reports them."""
    load_deepspeed()  # on the accelerator ktrain picks
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    code, problems, _ = check(capsys, config(deepspeed="zero2", fp16=True))
    if accelerator.is_fp16_supported():
        assert (code, problems) == (0, [])
    else:
        assert problems == [
            f"deepspeed.fp16.enabled: DeepSpeed's {accelerator.device_name()} accelerator cannot compute in fp16 on "
            "this machine; set fp16: false (bf16: true trains in 16 bits), in the preset zero2"
        ]
    nvme = {"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme", "nvme_path": str(tmp_path)}}}
    code, problems, _ = check(capsys, config(deepspeed=nvme))
    if accelerator.create_op_builder("AsyncIOBuilder").is_compatible():
        assert (code, problems) == (0, [])
    else:
        assert len(problems) == 1 and problems[0].startswith(
            "deepspeed.zero_optimization.offload_param.device: nvme needs DeepSpeed's async_io op, which needs libaio"
        )


def test_deepspeed_with_fsdp_names_both_plugins(config, capsys, monkeypatch) -> None:
    """Both claim ``sharding``: the kernel stops the run naming both plugins and the keys that enabled them."""
    if importlib.util.find_spec("ktrain_fsdp") is None:  # stand in for ktrain-plugin-fsdp's claim, as it makes it
        import ktrain.config.plan
        from ktrain.config.activation import discover

        keys = attrs.make_class("FsdpKeys", {"fsdp_version": attrs.field(default=None, metadata={"help": "FSDP"})})
        fsdp = types.ModuleType("fsdp")
        fsdp.ktrain_register_config = hookimpl(lambda register: register(keys))

        def ktrain_activate(config, activate):
            if config.fsdp_version:
                activate(types.SimpleNamespace(), roles=("sharding",), keys=("fsdp_version",))

        fsdp.ktrain_activate = hookimpl(ktrain_activate)
        monkeypatch.setattr(ktrain.config.plan, "discover", lambda more=(): discover([("fsdp", fsdp), *more]))
    code = main(["check", str(config(deepspeed="zero2", fsdp_version=2))])
    err = capsys.readouterr().err
    assert code == 2
    assert err.startswith("ktrain: two plugins claim the role 'sharding'")
    assert "'fsdp'" in err and "enabled by: fsdp_version" in err
    assert "'deepspeed' (ktrain-plugin-deepspeed" in err and "enabled by: deepspeed" in err


def test_entry_module_imports_nothing_heavy() -> None:
    code = (
        "import sys\nfrom ktrain.cli import build_parser\nimport ktrain_deepspeed.entry\n"
        "parser, commands = build_parser()\nassert 'fetch' in commands\n"
        "print(sorted(m for m in ('torch', 'transformers', 'deepspeed') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
