"""On a CUDA GPU: the same losses with Liger's kernels as without them (skipped elsewhere).

Tiny Llama and Qwen3 models, fp32, 4 steps of the same rows: Liger's RoPE, RMSNorm, SwiGLU and fused
linear cross entropy change only the order of floating-point operations, so the losses agree to a
relative 2e-3 (the chunked loss sums in another order; TF32 is off).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records

LIGER = {
    "liger_rope": True,
    "liger_rms_norm": True,
    "liger_glu_activation": True,
    "liger_fused_linear_cross_entropy": True,
}


@pytest.mark.gpu
@pytest.mark.parametrize(
    ("architecture", "chunk_mem_const"), [("llama", 1), ("qwen3", 1), ("llama", 8)], ids=["llama", "qwen3", "llama-8"]
)
def test_liger_losses_match_plain_transformers(tmp_path: Path, architecture: str, chunk_mem_const: int) -> None:
    """``chunk_mem_const`` 8 (``liger_flce_chunk_mem_const``) cuts the loss into fewer, larger chunks."""
    if architecture == "qwen3":
        model_dir(tmp_path, model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    else:
        model_dir(tmp_path)
    dataset(tmp_path, 200)
    plain = write_config(tmp_path, "plain.yaml", max_steps=4, output_dir=str(tmp_path / "plain"))
    keys = {**LIGER, "liger_flce_chunk_mem_const": chunk_mem_const}
    fused = write_config(tmp_path, "liger.yaml", max_steps=4, output_dir=str(tmp_path / "liger"), **keys)
    assert ktrain("run", str(plain)).returncode == 0
    done = ktrain("run", str(fused))
    assert done.returncode == 0, done.stderr
    assert "liger: rope (function), rms_norm (" in done.stdout
    expected, got = records(tmp_path / "plain"), records(tmp_path / "liger")
    assert got.keys() == expected.keys() == set(range(1, 5))
    for step in expected:
        assert got[step] == pytest.approx(expected[step], rel=2e-3), step
