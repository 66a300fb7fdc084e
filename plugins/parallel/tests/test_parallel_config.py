"""Bad parallel layouts stop before any rank starts: exit code 2, the key named, and what would work.

Each case starts from the tiny Llama of tests/kit.py (4 attention heads, 2 KV heads, vocabulary 100) and
runs ``ktrain check`` in process; one goes through ``ktrain run`` in a subprocess to show no rank starts.
The two parallel configs shipped in configs/ pass ``ktrain check`` at their world sizes.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from ktrain.cli import main
from ktrain.testing import dataset, ktrain, model_dir, write_config
from tests.kit import REPO

TP_FSDP = {"tensor_parallel_size": 2, "fsdp_version": 2}
CASES = {
    "tp_larger_than_kv_heads": (
        {"tensor_parallel_size": 4, "fsdp_version": 2},
        4,
        ("tensor_parallel_size", "does not divide the model's 2 KV heads", "use a divisor of 2 (1, 2)"),
    ),
    "tp_without_fsdp2": ({"tensor_parallel_size": 2}, 2, ("tensor_parallel_size", "needs fsdp_version: 2")),
    "tp_with_deepspeed": (
        {"tensor_parallel_size": 2, "deepspeed": "zero2"},
        2,
        ("tensor_parallel_size", "does not compose with deepspeed"),
    ),
    "sizes_not_the_ranks": (
        {**TP_FSDP, "dp_shard_size": 2},
        6,
        ("dp_shard_size, tensor_parallel_size", "multiply to 4", "run has 6 ranks"),
    ),
    "cp_with_flex_attention": (
        {"context_parallel_size": 2, "attn_implementation": "flex_attention"},
        2,
        ("attn_implementation", "SDPA", "flex_attention"),
    ),
    "cp_and_ulysses_both": (
        {"context_parallel_size": 2, "sequence_parallel_degree": 2},
        2,
        ("sequence_parallel_degree", "set one"),
    ),
    "ulysses_heads_not_divisible": (
        {"sequence_parallel_degree": 3},
        3,
        ("sequence_parallel_degree", "4 attention heads", "does not divide"),
    ),
    "ring_not_implemented": (
        {"context_parallel_size": 2, "ring_attn_func": "batch_ring"},
        2,
        ("ring_attn_func", "not implemented", "varlen_llama3"),
    ),
}


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("parallel-config")
    model_dir(path)
    dataset(path, 20)
    return path


@pytest.mark.parametrize("case", CASES, ids=str)
def test_bad_layout_is_refused_naming_the_key(case: str, root: Path, capsys: pytest.CaptureFixture) -> None:
    keys, world, expected = CASES[case]
    config = write_config(root, f"{case}.yaml", **keys)
    assert main(["check", str(config), "--world-size", str(world)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for text in expected:
        assert text in err, (text, err)


def test_a_model_family_without_a_plan_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    folder = model_dir(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "model_type": "gpt_neox"}))
    dataset(tmp_path, 20)
    assert main(["check", str(write_config(tmp_path, **TP_FSDP)), "--world-size", "2"]) == 2
    err = capsys.readouterr().err
    assert "tensor_parallel_size" in err and "no tensor-parallel plan for model_type 'gpt_neox'" in err, err
    assert "llama, mistral, qwen2, qwen3" in err


def test_no_rank_starts_on_a_bad_layout(root: Path) -> None:
    config = write_config(root, "bad.yaml", output_dir=str(root / "bad"), tensor_parallel_size=4, fsdp_version=2)
    done = ktrain("run", str(config), "--nproc-per-node", "4")
    assert done.returncode == 2, done.stderr
    assert "KV heads" in done.stderr and "Traceback" not in done.stderr
    assert not (root / "bad").exists()


@pytest.mark.parametrize(("name", "world"), [("hsdp_tp", 16), ("qwen3_fsdp_tp_cp", 8)])
def test_the_seed_parallel_configs_check(name: str, world: int, capsys: pytest.CaptureFixture) -> None:
    path = REPO / "configs" / f"{name}.yaml"
    written = yaml.safe_load(path.read_text())
    assert main(["check", str(path), "--world-size", str(world)]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    sizes = [written.get(k, 1) for k in ("dp_replicate_size", "dp_shard_size", "context_parallel_size")]
    mesh = f"dp_replicate {sizes[0]} x dp_shard {sizes[1]} x cp {sizes[2]} x tp {written['tensor_parallel_size']}"
    assert f"mesh: {mesh} = {world} ranks" in out, out


def test_check_of_a_parallel_config_imports_no_torch() -> None:
    code = (
        "import sys; from ktrain.cli import main; "
        f"code = main(['check', {str(REPO / 'configs' / 'qwen3_fsdp_tp_cp.yaml')!r}, '--world-size', '8']); "
        "sys.exit(code or 3 * ('torch' in sys.modules))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
