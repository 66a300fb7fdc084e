"""``python -m ktrain_deepspeed.build_ops``: DeepSpeed's CPU ops built (or loaded from the cache) ahead of runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from ktrain_deepspeed.build_ops import OPS


@pytest.mark.skipif(torch.cuda.is_available(), reason="builds the ops of DeepSpeed's CPU accelerator")
def test_each_cpu_op_is_built_and_loads() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "ktrain_deepspeed.build_ops"], capture_output=True, text=True, timeout=900
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(OPS) == {"ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder"}
    for name in OPS:
        assert f"DeepSpeed op {name}: ready in" in done.stdout
