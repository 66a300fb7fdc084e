"""Per-rank parameter and optimizer-state memory falls as 1/N: the benchmark behind the README's figures, run small."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "shard_memory.py"


@pytest.mark.slow
def test_sharded_parameters_and_optimizer_state_fall_as_one_over_n() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--ranks", "2", "--tiny"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) ", done.stdout, re.MULTILINE)
    (ranks, params, optim, share) = rows[0]
    assert len(rows) == 1 and ranks == "2", done.stdout
    # share of the unsharded fp32 parameters + AdamW's two moments: 1/2, plus FSDP's padding of dim 0 to
    # a multiple of 2 (none for these even sizes); the optimizer state is twice the parameters, sharded alike
    assert 0.5 <= float(share) <= 0.5 * 1.02, done.stdout
    assert float(optim) == pytest.approx(2 * float(params), rel=0.01)
