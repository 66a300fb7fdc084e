"""The run directory: refusing to clobber, locking against a second run, and the files a run leaves.

Layout of ``output_dir``::

    run.json                 ktrain version and plugins of the run
    config.yaml              the keys the user set (after --set): what the ranks read
    config.resolved.yaml     every key with its value
    metrics.jsonl            one JSON object per logged step and evaluation
    checkpoints/step-N/      complete checkpoints, each with manifest.json; .tmp-* are incomplete
    final/                   the trained model as HF safetensors, with the tokenizer
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import IO

from ktrain import __version__
from ktrain.config.report import ConfigError
from ktrain.files import atomic_write_text
from ktrain.resolve import Plan

RUN_FILE = "run.json"
LOCK_FILE = ".ktrain.lock"
WORKER_LOCK_FILE = ".ktrain.workers.lock"
CHECKPOINTS = "checkpoints"


class RunDirInUse(ConfigError):
    """Another run (its launcher or its ranks) holds the output_dir."""


def _try_lock(path: Path, mode: int) -> IO | None:
    handle = open(path, "a+")  # noqa: SIM115 - kept open for the life of the run
    try:
        fcntl.flock(handle, mode | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        return None
    return handle


def lock_workers(out: Path) -> IO:
    """Taken by every rank: a shared lock that outlives a killed launcher."""
    return open_lock(out / WORKER_LOCK_FILE, fcntl.LOCK_SH)


def open_lock(path: Path, mode: int) -> IO:
    handle = _try_lock(path, mode)
    if handle is None:
        raise RunDirInUse.single(
            "output_dir", f"{path.parent} is in use by another ktrain run (or its ranks); wait for it or stop it"
        )
    return handle


def prepare_run_dir(plan: Plan, resume: bool, overwrite: bool) -> tuple[Path, IO]:
    """Check ``output_dir`` for this run, lock it, and write the run's config files.

    Refuses (``ConfigError`` naming ``output_dir``) a folder of an earlier run without ``--resume`` or
    ``--overwrite``, a non-empty folder ktrain did not write, and a folder in use. Nothing is changed
    before every check passed.
    """
    config = plan.config
    out = Path(config.output_dir).expanduser().absolute()
    ours = (out / RUN_FILE).is_file()
    if out.exists() and any(out.iterdir()) and not ours:
        raise ConfigError.single(
            "output_dir", f"{out} holds files ktrain did not write; choose an empty or new output_dir"
        )
    if ours and not (resume or overwrite or config.auto_resume_from_checkpoints or config.resume_from_checkpoint):
        raise ConfigError.single(
            "output_dir", f"{out} holds an earlier run: pass --resume to continue it or --overwrite to start afresh"
        )
    if resume and overwrite:
        raise ConfigError.single("--overwrite", "--resume and --overwrite contradict each other; pick one")
    out.mkdir(parents=True, exist_ok=True)
    lock = open_lock(out / LOCK_FILE, fcntl.LOCK_EX)
    workers = _try_lock(out / WORKER_LOCK_FILE, fcntl.LOCK_EX)
    if workers is None:
        lock.close()
        raise RunDirInUse.single("output_dir", f"ranks of an earlier run still hold {out}; stop them first")
    workers.close()
    if overwrite and ours:
        for child in out.iterdir():
            if child.name not in (LOCK_FILE, WORKER_LOCK_FILE):
                shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
    write_run_files(out, plan)
    return out, lock


def write_run_files(out: Path, plan: Plan) -> None:
    config = plan.config
    plugins = [
        {
            "name": a.plugin.name,
            "distribution": a.plugin.distribution,
            "version": a.plugin.version,
            "roles": list(a.roles),
            "default": a.default,
        }
        for a in plan.plugins.activations
    ]
    atomic_write_text(
        out / RUN_FILE, json.dumps({"ktrain": __version__, "pid": os.getpid(), "plugins": plugins}, indent=1)
    )
    atomic_write_text(out / "config.yaml", config.to_yaml(only_present=True))
    atomic_write_text(out / "config.resolved.yaml", config.to_yaml())
