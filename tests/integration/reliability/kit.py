"""Helpers of the fault battery: launching ``ktrain`` so orphaned ranks cannot block the test, checkpoint
hashes, damage done to checkpoint files, and a pickle that would run code."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import pickle
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

KEYS = dict(  # every battery run: accumulation 2, warm-up + cosine; the tiny model has dropout, the data shuffles
    max_steps=6, save_steps=2, gradient_accumulation_steps=2, warmup_steps=2, lr_scheduler="cosine"
)
PG_TIMEOUT_S = 10


def start(*args: str, log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    """Start ``ktrain ARGS`` with its output in ``log``: a rank orphaned by a killed launcher holds no pipe of ours."""
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "KTRAIN_PG_TIMEOUT_S": str(PG_TIMEOUT_S), **(env or {})}
    with open(log, "w") as out:
        return subprocess.Popen([sys.executable, "-m", "ktrain.cli", *args], stdout=out, stderr=out, env=full_env)


def run(*args: str, log: Path, env: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, str]:
    """Run ``ktrain ARGS`` to its end; return its exit code and output."""
    process = start(*args, log=log, env=env)
    code = process.wait(timeout=timeout)
    return code, log.read_text()


def checkpoints(run_dir: Path) -> list[str]:
    """Names under ``run_dir/checkpoints``, sorted."""
    return sorted(p.name for p in (run_dir / "checkpoints").iterdir())


def file_hashes(checkpoint: Path) -> dict[str, str]:
    """sha256 of every file of a checkpoint, as its manifest records them."""
    return {
        name: entry["sha256"] for name, entry in json.loads((checkpoint / "manifest.json").read_text())["files"].items()
    }


def same_state(a: Path, b: Path) -> bool:
    """Two checkpoints hold the same model, optimizer and schedule (byte for byte) and the same torch RNG.

    The rank files are compared by their torch generator: ktrain does not seed Python's ``random``, which
    nothing in training draws from, so its state differs between two fresh runs. DCP's ``.metadata`` (an
    index naming the folder it was written in and a random save id) differs too; its shards are compared.
    """
    import torch

    fa, fb = file_hashes(a), file_hashes(b)
    ranks = {name for name in fa if name.startswith("rank-")}
    skip = ranks | {name for name in fa if name.endswith(".metadata")}
    if {k: v for k, v in fa.items() if k not in skip} != {k: v for k, v in fb.items() if k not in skip}:
        return False
    for name in ranks:
        ra, rb = (torch.load(c / name, weights_only=True)["rng"]["torch"] for c in (a, b))
        if not torch.equal(ra, rb):
            return False
    return fa.keys() == fb.keys()


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def flip_byte(path: Path, offset: int = 100) -> None:
    """Invert one byte of ``path`` in place (its size stays)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


class _Touch:
    """Unpickling this creates ``marker``: the payload of a malicious checkpoint file."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def malicious_pickle(marker: Path, size: int = 0) -> bytes:
    """A pickle whose loading (``pickle.load``, ``torch.load(weights_only=False)``) creates ``marker``, padded
    after its end to ``size`` bytes (to pass a check of sizes; unpickling stops at the end)."""
    payload = pickle.dumps(_Touch(marker))
    return payload + b"\0" * (size - len(payload))


def wait_unlocked(lock: Path, timeout: float) -> float:
    """Wait until no process holds ``lock`` (flock); return the seconds waited."""
    started = time.monotonic()
    while True:
        with open(lock, "a+") as handle:
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return time.monotonic() - started
            except BlockingIOError:
                pass
        if time.monotonic() - started > timeout:
            raise TimeoutError(f"{lock} still held after {timeout} s")
        time.sleep(0.2)
