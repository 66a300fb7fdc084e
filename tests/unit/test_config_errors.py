"""``ktrain check`` on bad configs: exit code 2, no traceback, and a message that names the key.

Every case starts from a config that passes (a real local model folder and dataset), changes one thing,
and states the key path the message must name. A few cases go through a real subprocess, the rest call
``ktrain.cli.main`` in process.
"""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest

from ktrain.cli import EXIT_BAD_INPUT, EXIT_OK, main

BASE = """\
base_model: @MODEL@
datasets:
  - path: @DATA@
    type: chat_template
output_dir: @OUT@
"""
# BASE without the datasets list, for cases that write their own.
NO_DATA = "base_model: @MODEL@\noutput_dir: @OUT@\n"


class Case(NamedTuple):
    id: str
    text: str | bytes | None  # None: the config file does not exist
    expect: tuple[str, ...]  # substrings of stderr: the key path first, then what the message says
    args: tuple[str, ...] = ()
    subprocess: bool = False
    needs_absent: str | None = None  # a distribution that must not be installed for the case to hold


CASES = [
    # The file itself.
    Case("malformed_yaml", BASE + "learning_rate: 1e-4\n  seed: 3\n", ("not valid YAML", "line 7"), subprocess=True),
    Case("unclosed_flow_list", BASE + "datasets_extra: [1, 2\nseed: 3\n", ("not valid YAML", "line 7")),
    Case("not_a_mapping", "- base_model: x\n- seed: 1\n", ("must hold a mapping", "not a list")),
    Case("scalar_file", "just some words\n", ("must hold a mapping", "not a str")),
    Case("missing_file", None, ("does not exist", "missing.yaml"), subprocess=True),
    Case("not_utf8", b"base_model: \xff\xfe\n", ("cannot read config file", "config.yaml")),
    Case("duplicate_key", BASE + "seed: 1\nseed: 2\n", ("duplicate key 'seed'", "line 7", "first on line 6")),
    Case("unhashable_key", BASE + "{[a]: b}: 1\n", ("not valid YAML", "line 6", "plain value")),
    # Types: no string is quietly turned into a number or a bool.
    Case("string_for_int", BASE + "micro_batch_size: '8'\n", ("micro_batch_size:", "expected an integer")),
    Case("string_true_for_bool", BASE + 'trust_remote_code: "true"\n', ("trust_remote_code:", "boolean")),
    Case("bool_for_number", BASE + "learning_rate: true\n", ("learning_rate:", "expected a number")),
    Case("bool_for_int", BASE + "seed: false\n", ("seed:", "expected an integer", "bool")),
    Case("float_for_int", BASE + "max_steps: 2.5\n", ("max_steps:", "expected an integer")),
    Case(
        "list_for_mapping", BASE + "gradient_checkpointing_kwargs: [a]\n", ("gradient_checkpointing_kwargs:", "mapping")
    ),
    Case("mapping_for_list", NO_DATA + "datasets: {path: x}\n", ("datasets:", "expected a list")),
    Case("string_for_list", NO_DATA + "datasets: data.jsonl\n", ("datasets:", "expected a list")),
    Case("null_list_item", NO_DATA + "datasets: [null]\n", ("datasets[0]:", "mapping")),
    Case("int_in_nested_str", NO_DATA + "datasets:\n  - path: 7\n", ("datasets[0].path:", "expected a string")),
    Case("bad_literal", BASE + "save_strategy: sometimes\n", ("save_strategy:", "'steps'", "'epoch'", "'no'")),
    Case("bad_literal_nested", NO_DATA + "datasets:\n  - {path: @DATA@, ds_type: xml}\n", ("datasets[0].ds_type:",)),
    Case("bad_bool_or_literal", BASE + "bf16: maybe\n", ("bf16:", "'auto'")),
    # Keys.
    Case("unknown_top_level", BASE + "micro_batch_sise: 2\n", ("micro_batch_sise:", "did you mean 'micro_batch_size'")),
    Case(
        "unknown_nested",
        NO_DATA + "datasets:\n  - path: @DATA@\n    typ: chat_template\n",
        ("datasets[0].typ:", "did you mean 'type'"),
        subprocess=True,
    ),
    Case("non_string_nested_key", NO_DATA + "datasets:\n  - {path: @DATA@, 1: 2}\n", ("datasets[0].1:", "unknown key")),
    Case("non_string_key", BASE + "3: three\n", ("3:", "keys must be strings")),
    Case(
        "uninstalled_deepspeed",
        BASE + "deepspeed: {zero_optimization: {stage: 3}}\n",
        ("deepspeed:", "ktrain-plugin-deepspeed", "pip install"),
        needs_absent="ktrain-plugin-deepspeed",
    ),
    Case(
        "uninstalled_lora", BASE + "lora_r: 8\n", ("lora_r:", "ktrain-plugin-lora"), needs_absent="ktrain-plugin-lora"
    ),
    # Names chosen among what plugins registered.
    Case("unknown_optimizer", BASE + "optimizer: adamw9\n", ("optimizer:", "no optimizer named 'adamw9'", "known:")),
    Case("unknown_lr_scheduler", BASE + "lr_scheduler: cosin\n", ("lr_scheduler:", "did you mean 'cosine'")),
    Case(
        "unknown_dataset_type",
        NO_DATA + "datasets:\n  - {path: @DATA@, type: alpacca}\n",
        ("datasets[0].type:", "did you mean 'alpaca'"),
    ),
    # Paths.
    Case(
        "missing_base_model_path",
        "base_model: @MISSING@\ndatasets: [{path: @DATA@}]\n",
        ("base_model:", "does not exist"),
    ),
    Case("no_base_model", "datasets: [{path: @DATA@}]\noutput_dir: @OUT@\n", ("base_model:", "required")),
    Case("missing_dataset_path", NO_DATA + "datasets: [{path: @MISSING@}]\n", ("datasets[0].path:", "does not exist")),
    Case("empty_dataset_path", NO_DATA + "datasets: [{type: chat_template}]\n", ("datasets[0].path:", "required")),
    Case("no_datasets", NO_DATA, ("datasets:", "no training data")),
    Case(
        "output_dir_under_a_file",
        "base_model: @MODEL@\ndatasets: [{path: @DATA@}]\noutput_dir: @FILE@/run\n",
        ("output_dir:", "cannot be written", "a-file is not a writable folder"),
    ),
    Case("base_model_name_too_long", BASE.replace("@MODEL@", "./" + "m" * 300), ("base_model:", "does not exist")),
    # Mesh.
    Case(
        "mesh_product",
        BASE + "dp_replicate_size: 3\n",
        ("dp_replicate_size:", "multiply to 3", "4 ranks"),
        args=("--world-size", "4"),
    ),
    Case(
        "two_minus_one",
        BASE + "dp_replicate_size: -1\ndp_shard_size: -1\n",
        ("dp_replicate_size, dp_shard_size:", "only one mesh size may be -1"),
        args=("--world-size", "4"),
    ),
    Case("mesh_size_zero", BASE + "dp_replicate_size: 0\n", ("dp_replicate_size:", "positive number of ranks")),
    Case("world_size_zero", BASE, ("--world-size:", "positive"), args=("--world-size", "0")),
    Case("dp_shard_without_plugin", BASE + "dp_shard_size: 2\n", ("dp_shard_size:", "sharding plugin")),
    Case(
        "tp_without_plugin",
        BASE + "tensor_parallel_size: 2\n",
        ("tensor_parallel_size:", "ktrain-plugin-parallel"),
        needs_absent="ktrain-plugin-parallel",
    ),
    Case(
        "cp_without_plugin",
        BASE + "context_parallel_size: 2\n",
        ("context_parallel_size:", "'cp' dimension"),
        needs_absent="ktrain-plugin-parallel",
    ),
    Case("tp_without_fsdp2", BASE + "tensor_parallel_size: 2\n", ("tensor_parallel_size:", "needs fsdp_version: 2")),
    # Relations between keys.
    Case("warmup_both", BASE + "warmup_steps: 10\nwarmup_ratio: 0.1\n", ("warmup_ratio:", "not both")),
    Case("warmup_ratio_range", BASE + "warmup_ratio: 1.5\n", ("warmup_ratio:", "[0, 1)")),
    Case("bf16_and_fp16", BASE + "bf16: true\nfp16: true\n", ("bf16:", "fp16")),
    Case("bfloat16_and_fp16", BASE + "bfloat16: true\nfp16: true\n", ("bfloat16:", "choose one")),
    Case("save_steps_and_per_epoch", BASE + "save_steps: 10\nsaves_per_epoch: 2\n", ("saves_per_epoch:", "not both")),
    Case(
        "flash_attention_vs_eager",
        BASE + "flash_attention: true\nattn_implementation: eager\n",
        ("attn_implementation:", "flash_attention_2"),
    ),
    Case(
        "two_attention_flags",
        BASE + "flash_attention: true\nsdp_attention: true\n",
        ("flash_attention, sdp_attention:",),
    ),
    Case("micro_batch_size_zero", BASE + "micro_batch_size: 0\n", ("micro_batch_size:", "at least 1")),
    Case("negative_learning_rate", BASE + "learning_rate: -1e-4\n", ("learning_rate:", "negative")),
    Case(
        "every_problem_at_once",
        BASE + "micro_batch_size: 0\noptimizer: adamw9\ndp_replicate_size: 3\n",
        ("3 problem(s)", "micro_batch_size:", "optimizer:", "dp_replicate_size:"),
        args=("--world-size", "4"),
    ),
    # --set.
    Case("set_without_equals", BASE, ("--set:", "'seed' is not KEY=VALUE"), args=("--set", "seed"), subprocess=True),
    Case("set_empty_key", BASE, ("--set:", "KEY=VALUE"), args=("--set", "=3")),
    Case("set_missing_list_index", BASE, ("--set:", "datasets.3"), args=("--set", "datasets.3.path=x")),
    Case("set_into_a_value", BASE, ("--set:", "output_dir holds a value"), args=("--set", "output_dir.x=1")),
    Case("set_wrong_type", BASE, ("micro_batch_size:", "expected an integer"), args=("--set", "micro_batch_size=abc")),
    Case("set_unknown_nested", BASE, ("datasets[0].typ:", "did you mean 'type'"), args=("--set", "datasets.0.typ=x")),
]


def _installed(distribution: str) -> bool:
    try:
        importlib.metadata.distribution(distribution)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture
def paths(tmp_path: Path, tiny_model_dir: Path, tiny_chat_jsonl: Path) -> dict[str, str]:
    """What the @NAME@ placeholders of a case stand for (JSON strings are valid YAML scalars)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    return {
        "@MODEL@": json.dumps(str(tiny_model_dir)),
        "@DATA@": json.dumps(str(tiny_chat_jsonl)),
        "@OUT@": json.dumps(str(tmp_path / "out")),
        "@MISSING@": json.dumps(str(tmp_path / "no-such-thing")),
        "@FILE@": str(blocker),
    }


def write_config(tmp_path: Path, text: str | bytes | None, paths: dict[str, str]) -> Path:
    if text is None:
        return tmp_path / "missing.yaml"
    path = tmp_path / "config.yaml"
    if isinstance(text, bytes):
        path.write_bytes(text)
        return path
    for placeholder, value in paths.items():
        text = text.replace(placeholder, value)
    path.write_text(text, encoding="utf-8")
    return path


def run_check(args: list[str], cwd: Path, capsys: pytest.CaptureFixture, via_subprocess: bool):
    """``ktrain check ARGS``: (exit code, stdout, stderr)."""
    if via_subprocess:
        done = subprocess.run(
            [sys.executable, "-m", "ktrain.cli", "check", *args], cwd=cwd, capture_output=True, text=True, timeout=120
        )
        return done.returncode, done.stdout, done.stderr
    code = main(["check", *args])
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_bad_config_exits_2_naming_the_key(case: Case, tmp_path, paths, capsys, monkeypatch) -> None:
    if case.needs_absent and _installed(case.needs_absent):
        pytest.skip(f"{case.needs_absent} is installed")
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, case.text, paths)
    code, out, err = run_check([str(config), *case.args], tmp_path, capsys, case.subprocess)
    assert code == EXIT_BAD_INPUT, f"exit {code}\nstdout:\n{out}\nstderr:\n{err}"
    assert "Traceback" not in err
    assert err.startswith("ktrain: ")
    for text in case.expect:
        assert text in err, f"{text!r} not in:\n{err}"
    assert not (tmp_path / "out").exists()


def test_case_table_is_large_and_unique() -> None:
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids))
    assert len(ids) >= 25
    assert sum(c.subprocess for c in CASES) >= 3


@pytest.mark.parametrize("via_subprocess", [False, True], ids=["in_process", "subprocess"])
def test_good_config_passes_and_prints_the_mesh(via_subprocess, tmp_path, paths, capsys) -> None:
    config = write_config(tmp_path, BASE + "micro_batch_size: 2\nlearning_rate: 1e-4\n", paths)
    code, out, err = run_check([str(config), "--world-size", "2"], tmp_path, capsys, via_subprocess)
    assert code == EXIT_OK, err
    assert err == ""
    assert f"config {config}: OK" in out
    assert "mesh: dp_replicate 2 x dp_shard 1 x cp 1 x tp 1 = 2 ranks" in out.splitlines()
    assert f"learning_rate = 0.0001    [kernel; {config}:7]" in out
    assert "sharding: kernel default" in out


def test_set_overrides_the_file_and_says_so(tmp_path, paths, capsys) -> None:
    config = write_config(tmp_path, BASE, paths)
    code, out, _ = run_check([str(config), "--set", "micro_batch_size=4"], tmp_path, capsys, False)
    assert code == EXIT_OK
    assert "micro_batch_size = 4    [kernel; --set]" in out


def _snapshot(root: Path) -> dict[str, bytes | None]:
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else None) for p in sorted(root.rglob("*"))}


@pytest.mark.parametrize("extra", ["", "micro_batch_size: 0\n"], ids=["passing", "failing"])
def test_check_writes_nothing(extra, tmp_path, paths, capsys, monkeypatch, tiny_model_dir, tiny_chat_jsonl) -> None:
    monkeypatch.chdir(tmp_path)
    config = write_config(tmp_path, BASE.replace("@OUT@", "runs/first") + extra, paths)
    watched = [tmp_path, tiny_model_dir, tiny_chat_jsonl.parent]
    before = [_snapshot(root) for root in watched]
    run_check([str(config), "--world-size", "2"], tmp_path, capsys, False)
    assert [_snapshot(root) for root in watched] == before
    assert not (tmp_path / "runs").exists()


def test_check_imports_no_heavy_library(tmp_path, paths) -> None:
    config = write_config(tmp_path, BASE, paths)
    code = (
        "import sys\nfrom ktrain.cli import main\n"
        f"assert main(['check', {str(config)!r}]) == 0\n"
        "print(sorted(m for m in ('torch', 'transformers', 'deepspeed', 'peft') if m in sys.modules))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "[]"
