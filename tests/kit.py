"""Helpers for tests that train: a tiny model folder, a small chat dataset, running ``ktrain`` for real."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from ktrain.testing.assets import write_model_dir

REPO = Path(__file__).resolve().parents[1]
QUICKSTART = REPO / "configs" / "quickstart"


def model_dir(root: Path, **overrides: Any) -> Path:
    """``ktrain.testing``'s tiny Llama folder in ``root/model`` (``overrides`` change its config)."""
    return write_model_dir(root / "model", **overrides)


def dataset(root: Path, rows: int) -> Path:
    """The first ``rows`` rows of the quickstart's training data."""
    path = root / "train.jsonl"
    lines = (QUICKSTART / "data" / "train.jsonl").read_text().splitlines()[:rows]
    path.write_text("\n".join(lines) + "\n")
    return path


def write_config(root: Path, name: str = "run.yaml", **keys: Any) -> Path:
    """A run config over ``model_dir``/``dataset`` in ``root`` with ``keys`` on top."""
    config = {
        "base_model": str(root / "model"),
        "random_init_weights": True,
        "datasets": [{"path": str(root / "train.jsonl"), "type": "chat_template"}],
        "sequence_len": 64,
        "micro_batch_size": 4,
        "learning_rate": 3.0e-3,
        "max_steps": 6,
        "output_dir": str(root / "out"),
        "seed": 7,
        **keys,
    }
    path = root / name
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def ktrain(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run the ``ktrain`` CLI in a fresh process, as a user would."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ktrain.cli", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )


def records(run_dir: Path, key: str = "loss") -> dict[int, float]:
    """step -> value of ``key`` in ``run_dir/metrics.jsonl``."""
    out = {}
    for line in (run_dir / "metrics.jsonl").read_text().splitlines():
        record = json.loads(line)
        if key in record:
            out[record["step"]] = record[key]
    return out
