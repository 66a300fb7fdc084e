"""torch.compile of the blocks on CPU: one graph for all blocks, the same training, and the keys' errors.

The parity runs use the ``aot_eager`` backend: dynamo captures each block and AOT autograd splits its
forward and backward as inductor would get them, then runs them with the eager kernels, so the losses
equal the uncompiled run's to the bit. Inductor's own kernels are checked on a GPU (``test_compile_gpu``).
"""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from torch._dynamo.utils import counters

from ktrain.config.plan import load_plugins_and_config
from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records
from ktrain_compile.keys import _compile_unless
from ktrain_compile.runtime import BlockCompiler

TINY = {
    "vocab_size": 100,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 3,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "use_cache": False,  # as the loader sets it for training
}


def compiler(**keys) -> BlockCompiler:
    config = {"torch_compile_backend": "aot_eager", "torch_compile_mode": None, "source": "run.yaml", **keys}
    return BlockCompiler(types.SimpleNamespace(**config))


def test_the_blocks_share_one_graph_and_keep_their_names() -> None:
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**TINY))
    model = copy.deepcopy(eager)
    names = list(model.state_dict())
    torch._dynamo.reset()
    counters.clear()
    compiler().ktrain_parallelize(model, types.SimpleNamespace(is_main=False))
    ids = torch.randint(0, 100, (2, 12))
    for step in range(2):
        losses = []
        for m in (eager, model):
            loss = m(input_ids=ids, labels=ids).loss
            loss.backward()
            losses.append(loss.item())
        assert losses[0] == losses[1], step
    assert counters["stats"]["unique_graphs"] == 1  # three blocks, one capture
    assert counters["aot_autograd"]["ok"] == 1
    assert list(model.state_dict()) == names
    for (name, a), b in zip(eager.named_parameters(), model.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad), name


def test_a_model_without_blocks_is_named() -> None:
    from ktrain.config.report import ConfigError

    with pytest.raises(ConfigError, match="torch_compile: Sequential names no transformer blocks"):
        compiler().ktrain_parallelize(torch.nn.Sequential(torch.nn.Linear(2, 2)), types.SimpleNamespace(is_main=False))


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path)
    dataset(tmp_path, 40)
    return tmp_path


def test_training_with_compiled_blocks_matches_eager(root: Path) -> None:
    """Same losses to the bit, and the exported model has the eager run's tensor names."""
    runs = {}
    for name, keys in (("eager", {}), ("compiled", {"torch_compile": True, "torch_compile_backend": "aot_eager"})):
        config = write_config(root, f"{name}.yaml", output_dir=str(root / name), **keys)
        done = ktrain("run", str(config))
        assert done.returncode == 0, done.stderr
        runs[name] = records(root / name)
    assert "compile: 2 LlamaDecoderLayer blocks (aot_eager)" in done.stdout
    assert len(runs["eager"]) == 6 and runs["compiled"] == runs["eager"]
    tensors = {}
    for name in runs:
        with safe_open(root / name / "final" / "model.safetensors", "pt") as f:
            tensors[name] = sorted(f.keys())
    assert tensors["compiled"] == tensors["eager"]


def test_fsdp2_and_checkpointing_run_around_the_compiled_blocks(root: Path) -> None:
    """FSDP2 on 2 ranks with activation checkpointing: its hooks stay eager around the compiled forward,
    and the losses equal the uncompiled run's to the bit."""
    pytest.importorskip("ktrain_fsdp")
    common = {
        "micro_batch_size": 2,
        "gradient_accumulation_steps": 2,
        "fsdp_version": 2,
        "fsdp_config": {"activation_checkpointing": True},
    }
    runs = {}
    for name, keys in (("eager", {}), ("compiled", {"torch_compile": True, "torch_compile_backend": "aot_eager"})):
        config = write_config(root, f"{name}.yaml", output_dir=str(root / name), **common, **keys)
        done = ktrain("run", str(config), "--nproc-per-node", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        runs[name] = records(root / name)
    assert len(runs["eager"]) == 6 and runs["compiled"] == runs["eager"]


def test_bad_keys_stop_before_training(root: Path) -> None:
    config = write_config(root, torch_compile=True, torch_compile_mode="fastest")
    done = ktrain("check", str(config))
    assert done.returncode == 2
    assert "torch_compile_mode: 'fastest' is not a mode of torch.compile" in done.stderr
    config = write_config(root, torch_compile=True, tensor_parallel_size=2, fsdp_version=2)
    done = ktrain("check", str(config), "--world-size", "2")
    assert done.returncode == 2
    assert "torch_compile: is not supported with tensor_parallel_size other than 1 yet" in done.stderr
    config = write_config(root, torch_compile=True, context_parallel_size=-1, fsdp_version=2)
    done = ktrain("check", str(config), "--world-size", "2")
    assert done.returncode == 2
    assert "torch_compile: is not supported with context_parallel_size other than 1 yet" in done.stderr
    config = write_config(root, torch_compile_backend="aot_eager")
    done = ktrain("check", str(config))
    assert (
        done.returncode == 0
        and "warning: torch_compile_backend: has no effect without torch_compile: true" in done.stdout
    )
    config = write_config(root, torch_compile=True, torch_compile_backend="nonesuch")
    done = ktrain("run", str(config))
    assert done.returncode == 2, done.stderr
    assert "torch_compile_backend: torch.compile has no backend 'nonesuch'" in done.stderr
    assert not (root / "out" / "metrics.jsonl").exists()


@pytest.mark.parametrize(
    ("keys", "why"),
    [
        ({}, None),
        ({"adapter": "qlora"}, "a quantized base"),
        ({"liger_rms_norm": True}, "Liger's kernels are asked for in the blocks"),
        ({"liger_swiglu": True}, "Liger's kernels are asked for in the blocks"),
        ({"liger_rope": False}, None),
    ],
)
def test_compiled_blocks_are_the_gpu_default_unless(root: Path, keys: dict, why: str | None) -> None:
    """Not over a quantized base, nor beside Liger's block kernels (which fuse the same work, faster)."""
    _, config = load_plugins_and_config(write_config(root, bf16=True, **keys), [])
    assert _compile_unless(config, (9, 0)) == why
