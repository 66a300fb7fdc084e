"""tools/device/multi_gpu.py, issue 10's parity measure, on two CPU ranks: FSDP2 on 2 ranks trains the same
global batch as one rank accumulating 2 micro-batches, to the same losses; a layout that changes the
training (a higher learning rate) is reported as differing, with exit code 1."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.kit import REPO, model_dir, write_config

TOOL = REPO / "tools" / "device" / "multi_gpu.py"


@pytest.mark.parametrize(("layout", "agree"), [("fsdp_version=2", True), ("learning_rate=0.03", False)])
def test_parity_of_two_ranks_against_one_rank_accumulating(layout: str, agree: bool, tmp_path: Path) -> None:
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], sequence_len=32, micro_batch_size=2)
    out = tmp_path / "parity.json"
    command = [sys.executable, str(TOOL), "parity", str(config), "--nproc", "2", "--layout", layout]
    done = subprocess.run(
        [*command, "--rtol", "1e-5", "--steps", "2", "--json", str(out)], capture_output=True, text=True
    )
    assert done.returncode == (0 if agree else 1), done.stdout + done.stderr[-3000:]
    result = json.loads(out.read_text())
    first, last = result["rows"]
    assert first["rel_diff"] <= 1e-5  # before any update the layout changes nothing
    assert (last["rel_diff"] <= 1e-5) == agree, result
    assert "against 1 rank x 2 accumulation" in done.stdout
