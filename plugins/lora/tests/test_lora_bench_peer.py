"""The QLoRA peer benchmark (plugins/lora/benchmarks/qlora_peer.py) runs on CPU on a tiny config: what the
H200 runs beside ``ktrain bench`` is the same script (figures: docs/performance.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import yaml

from ktrain.testing import model_dir
from tests.kit import REPO

SCRIPT = REPO / "plugins" / "lora" / "benchmarks" / "qlora_peer.py"


def test_qlora_peer_trains_an_all_linear_adapter_on_a_4bit_base(tmp_path: Path) -> None:
    folder = model_dir(tmp_path, vocab_size=128)
    config = tmp_path / "peer.yaml"
    keys = {"base_model": str(folder), "learning_rate": 1e-3, "sequence_len": 32, "micro_batch_size": 2}
    config.write_text(yaml.safe_dump({**keys, "gradient_checkpointing": True, "lora_r": 4, "lora_alpha": 8}))
    out = tmp_path / "peer.json"
    args = [sys.executable, str(SCRIPT), str(config), "--steps", "2", "--warmup", "1", "--json", str(out)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["tokens_per_s"] > 0 and report["peak_memory_gib"] is None  # no GPU here
    # r=4 on the 7 linear layers of each of the 2 blocks: r x (in + out) each (hidden 64, MLP 128, 2 KV heads of 16)
    per_block = 4 * ((64 + 64) + 2 * (64 + 32) + (64 + 64) + 2 * (64 + 128) + (128 + 64))
    assert report["trainable_params"] == 2 * per_block
    assert "qlora peer:" in done.stdout
