"""On a CUDA GPU: inductor's kernels in the blocks train as the eager blocks do (skipped elsewhere).

A tiny Llama, fp32 with TF32 off, 4 steps of the same rows: inductor fuses the blocks' pointwise work
(RMSNorm, rotary embedding, SwiGLU, residual adds) in another order of floating-point operations, so the
losses agree to a relative 1e-4.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records


@pytest.mark.gpu
def test_inductor_blocks_match_eager(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 200)
    plain = write_config(tmp_path, "plain.yaml", max_steps=4, output_dir=str(tmp_path / "plain"))
    compiled = write_config(tmp_path, "compiled.yaml", max_steps=4, output_dir=str(tmp_path / "c"), torch_compile=True)
    assert ktrain("run", str(plain)).returncode == 0
    done = ktrain("run", str(compiled))
    assert done.returncode == 0, done.stderr
    assert "compile: 2 LlamaDecoderLayer blocks (inductor)" in done.stdout
    want, got = records(tmp_path / "plain"), records(tmp_path / "c")
    assert len(want) == 4
    for step, loss in want.items():
        assert got[step] == pytest.approx(loss, rel=1e-4), step
