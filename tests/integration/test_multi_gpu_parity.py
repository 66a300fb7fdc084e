"""tools/device/multi_gpu.py's parity measure, on CPU ranks: FSDP2 on 2 ranks trains the same
global batch as one rank accumulating 2 micro-batches, to the same losses; a layout that changes the
training (a higher learning rate) is reported as differing, with exit code 1; the two Axolotl-style
configs written for 8 GPUs (configs/hsdp_tp.yaml, configs/qwen3_fsdp_tp_cp.yaml) match one rank on 8 ranks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ktrain.testing import model_dir, write_config
from tests.kit import REPO

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


# The two Axolotl-style configs written for 8 GPUs, on 8 CPU ranks with tiny models in place of the hub ones; the
# one-rank reference sets their mesh sizes back to 1.
SEED_LAYOUTS = {
    "hsdp_tp.yaml": ("llama", ["--layout", "dp_shard_size=2"], ["dp_replicate_size", "tensor_parallel_size"]),
    "qwen3_fsdp_tp_cp.yaml": ("qwen3", [], ["context_parallel_size", "tensor_parallel_size"]),
}


@pytest.mark.parametrize("name", sorted(SEED_LAYOUTS))
def test_the_8_gpu_seed_configs_match_one_rank_on_8_ranks(name: str, tmp_path: Path) -> None:
    """configs/hsdp_tp.yaml scaled to dp_replicate 2 x dp_shard 2 x tp 2, and configs/qwen3_fsdp_tp_cp.yaml as
    written (dp_shard 2 x cp 2 x tp 2): the losses of one rank accumulating the same global batch."""
    architecture, layout, sizes = SEED_LAYOUTS[name]
    if architecture == "qwen3":
        model_dir(tmp_path, model_type="qwen3", architectures=["Qwen3ForCausalLM"])
    else:
        model_dir(tmp_path)
    reference = [a for size in ["dp_shard_size", *sizes] for a in ("--reference", f"{size}=1")]
    keys = [
        "--set",
        f"base_model={tmp_path / 'model'}",
        "--set",
        "random_init_weights=true",
        "--set",
        "sequence_len=64",
    ]
    command = [sys.executable, str(TOOL), "parity", str(REPO / "configs" / name), "--nproc", "8", *keys]
    done = subprocess.run(
        [*command, *layout, *reference, "--rtol", "1e-4", "--steps", "2"], capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]
    assert "= 8 ranks against 1 rank" in done.stdout and "agree within rtol 0.0001" in done.stdout, done.stdout
