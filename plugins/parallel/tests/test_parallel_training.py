"""Tensor, context and Ulysses sequence parallelism for real on CPU ranks (gloo): loss parity with one process.

Every run trains for 6 steps on one global batch of 4 rows (the TP and CP runs recompute their blocks in
backward: gradient checkpointing after the split): the reference is 1 process x 2 micro-batches
of 2; the parallel runs split the same rows over ranks that share them (tp, cp) or take their own (dp).
Parity is a relative tolerance of 1e-5 on each step's loss in fp32; only the order of sums differs
(measured differences are below 1e-6). Two models: a Qwen3 with tied embeddings (per-head q/k norms,
the tying kept across the vocabulary split) on packed rows (document masks over shards), and the Llama
of tests/kit.py on padded rows, on a 3-D mesh with a checkpoint and an exact resume.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from safetensors.torch import load_file

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records

pytestmark = pytest.mark.slow
TOLERANCE = 1e-5
BATCH = {"micro_batch_size": 2, "gradient_accumulation_steps": 2}


def train(root: Path, name: str, ranks: int, *args: str, **keys: object) -> Path:
    config = write_config(root, f"{name}.yaml", output_dir=str(root / name), **{**BATCH, **keys})
    done = ktrain("run", str(config), "--nproc-per-node", str(ranks), *args)
    assert done.returncode == 0, done.stderr[-3000:]
    return root / name


def assert_parity(reference: Path, run: Path) -> None:
    expected, losses = records(reference), records(run)
    assert losses.keys() == expected.keys() == set(range(1, 7))
    for step, loss in expected.items():
        assert losses[step] == pytest.approx(loss, rel=TOLERANCE), (step, losses, expected)


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny tied-embedding Qwen3 on packed rows of 128 tokens, and its one-process reference run."""
    root = tmp_path_factory.mktemp("qwen3")
    model_dir(root, model_type="qwen3", architectures=["Qwen3ForCausalLM"], tie_word_embeddings=True)
    dataset(root, 200)
    train(root, "one", 1, sample_packing=True, sequence_len=128)
    return root


def test_tensor_parallel_matches_one_process(qwen3: Path) -> None:
    run = train(
        qwen3, "tp", 2, sample_packing=True, sequence_len=128, tensor_parallel_size=2, fsdp_version=2,
        gradient_checkpointing=True,
    )  # fmt: skip
    assert_parity(qwen3 / "one", run)


def test_context_parallel_matches_one_process(qwen3: Path) -> None:
    run = train(
        qwen3, "cp", 2, sample_packing=True, sequence_len=128, context_parallel_size=2, heads_k_stride=1,
        gradient_checkpointing=True,
    )  # fmt: skip
    assert_parity(qwen3 / "one", run)


def test_ulysses_sequence_parallel_matches_one_process(qwen3: Path) -> None:
    run = train(qwen3, "sp", 2, sample_packing=True, sequence_len=128, sequence_parallel_degree=2)
    assert_parity(qwen3 / "one", run)


def test_three_dimensional_mesh_matches_and_resumes_exactly(tmp_path: Path) -> None:
    """dp_shard 2 x cp 2 x tp 2 = 8 ranks (FSDP2 over dp_shard x cp, TP inside): parity, then a resume
    from the step-3 checkpoint gives the same losses and the same final weights as the uninterrupted run."""
    model_dir(tmp_path)
    dataset(tmp_path, 200)
    reference = train(tmp_path, "one", 1)
    mesh = {"dp_shard_size": 2, "context_parallel_size": 2, "tensor_parallel_size": 2, "fsdp_version": 2}
    run = train(tmp_path, "mesh", 8, gradient_accumulation_steps=1, save_steps=3, **mesh)
    assert_parity(reference, run)
    checkpoints = sorted((run / "checkpoints").glob("step-*"))
    assert [int(p.name.split("-")[1]) for p in checkpoints] == [3, 6], checkpoints
    step3 = str(checkpoints[0])
    resumed = train(
        tmp_path, "resumed", 8, gradient_accumulation_steps=1, save_steps=3, resume_from_checkpoint=step3, **mesh
    )
    assert records(resumed) == {step: loss for step, loss in records(run).items() if step > 3}
    a, b = load_file(run / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all((a[k] == b[k]).all() for k in a)
