"""Plain functions for tests that train without the fixtures: a folder holding the tiny model
(``root/model``) and data (``root/train.jsonl``), run configs over them, and ``ktrain`` run as a user would.

A test lays out its folder with ``model_dir(root)`` and ``dataset(root, rows)``, writes configs with
``write_config(root, name, **keys)``, runs ``ktrain("run", str(config))`` and reads the run's
``metrics.jsonl`` with ``read_metrics`` (``ktrain.testing.project``); ``launch_problems`` gives what a config's
checks before launch report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from ktrain.testing.assets import quickstart_rows, write_model_dir


def model_dir(root: Path, *, weights: bool = False, **overrides: Any) -> Path:
    """The tiny Llama folder in ``root/model`` (``overrides`` change its config; ``weights`` saves seeded random
    weights in it, see ``write_model_dir``)."""
    return write_model_dir(Path(root) / "model", weights=weights, **overrides)


def dataset(root: Path, rows: int) -> Path:
    """``root/train.jsonl``: the first ``rows`` training rows of the quickstart's arithmetic task."""
    path = Path(root) / "train.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(row) + "\n" for row in quickstart_rows(rows)), encoding="utf-8")
    return path


def write_config(root: Path, name: str = "run.yaml", **keys: Any) -> Path:
    """``root/NAME``: a run config over ``root/model`` and ``root/train.jsonl`` (6 steps, output in ``root/out``)
    with ``keys`` on top."""
    root = Path(root)
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
    path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def launch_problems(config: Path, device: str | None, capability: tuple[int, int] | None = None) -> str:
    """What the checks ``ktrain run`` makes before any rank starts report for ``config`` on one rank of ``device``
    (``"cuda"`` with ``capability``, ``"cpu"``; None: ``ktrain check``, which knows no device): the error
    report, else the warnings, one a line ('' when it passes)."""
    from ktrain.config.plan import prepare
    from ktrain.config.report import ConfigError

    try:
        plan = prepare(config, world_size=1 if device else None, device=device, capability=capability)
    except ConfigError as error:
        return str(error)
    return "\n".join(str(warning) for warning in plan.warnings)


def ktrain(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """Run ``ktrain ARGS`` in a fresh process, as a user would (one OpenMP thread, ``env`` on top of ours);
    return it (``returncode``, ``stdout``, ``stderr``)."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "ktrain.cli", *args], capture_output=True, text=True, env=full_env, timeout=timeout
    )
