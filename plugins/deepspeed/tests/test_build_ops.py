"""``python -m ktrain_deepspeed.build_ops``: DeepSpeed's CPU ops built (or loaded from the cache) ahead of runs."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ktrain_deepspeed.build_ops import OPS

ANNOUNCE = """
import types
from ktrain_deepspeed.build_ops import OPS, announce, built

print([built(name) for name in OPS])
announce(types.SimpleNamespace(say=lambda line: print("ktrain:", line)), OPS)
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="builds the ops of DeepSpeed's CPU accelerator")
def test_each_cpu_op_is_built_and_a_run_says_when_it_is_about_to_compile_one(tmp_path: Path) -> None:
    """The build makes (or loads from the cache) each CPU op; ``built`` then finds the ops it left in torch's
    extension cache, and none in an empty one, where ``announce`` says, for each, that it is building it."""
    build = [sys.executable, "-m", "ktrain_deepspeed.build_ops"]
    done = subprocess.run(build, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    assert set(OPS) == {"ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder"}
    for name in OPS:
        assert f"DeepSpeed op {name}: ready in" in done.stdout
    ready = subprocess.run([sys.executable, "-c", ANNOUNCE], capture_output=True, text=True, timeout=300)
    assert ready.stdout.splitlines() == ["[True, True, True]"], ready.stderr[-3000:]
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(tmp_path)}
    fresh = subprocess.run([sys.executable, "-c", ANNOUNCE], capture_output=True, text=True, timeout=300, env=env)
    assert fresh.stdout.splitlines() == [
        "[False, False, False]",
        "ktrain: building DeepSpeed's shared-memory communication op, once, about a minute",
        "ktrain: building DeepSpeed's CPU Adam, once, about a minute",
        "ktrain: building DeepSpeed's FusedAdam, once, about a minute",
    ], fresh.stderr[-3000:]
