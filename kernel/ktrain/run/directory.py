"""The run directory: refusing to clobber, locking against a second run, and the files a run leaves.

Layout of ``output_dir``::

    run.json                 ktrain version and plugins of the run
    config.yaml              the keys the user set (after --set): what the ranks read
    config.resolved.yaml     every key with its value
    metrics.jsonl            one JSON object per logged step and evaluation
    checkpoints/step-N/      complete checkpoints, each with manifest.json; .tmp-* are incomplete
    final/                   the trained model as HF safetensors, with the tokenizer
    logs/rank-N.log          what rank N wrote that is not ktrain's (ktrain.run.console)
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
from pathlib import Path
from typing import IO

from ktrain import __version__
from ktrain.config.plan import Plan
from ktrain.config.report import ConfigError
from ktrain.run.files import atomic_write_text

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
    """Lock ``path`` (``fcntl.LOCK_EX`` or ``LOCK_SH``) for the life of the returned handle; an exclusive
    lock records this process's id in the file, which the refusal of a second run names."""
    handle = _try_lock(path, mode)
    if handle is None:
        holder = path.read_text().strip() if path.is_file() else ""
        who = f"pid {holder}" if holder.isdigit() else "another ktrain run (or its ranks)"
        raise RunDirInUse.single("output_dir", f"{path.parent} is in use by {who}; wait for it or stop it")
    if mode == fcntl.LOCK_EX:
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
    return handle


def holds_results(out: Path) -> bool:
    """Whether ``out`` holds what an earlier run produced: a complete checkpoint or the final model.

    A folder a failed start left (the run files, the data cache, no checkpoint) holds nothing to keep.
    """
    return (out / "final").is_dir() or has_checkpoint(out)


def _committed(out: Path) -> set[str]:
    root = out / CHECKPOINTS
    return {p.name for p in root.iterdir() if p.is_dir() and p.name.startswith("step-")} if root.is_dir() else set()


def has_checkpoint(out: Path) -> bool:
    """Whether ``out/checkpoints`` holds a committed checkpoint whose files have the sizes of its manifest."""
    from ktrain.run.manifest import read

    return any(read(out / CHECKPOINTS / name) for name in _committed(out))


def _clear(out: Path, keep: tuple[str, ...]) -> None:
    for child in out.iterdir():
        if child.name not in (LOCK_FILE, WORKER_LOCK_FILE, *keep):
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()


def prepare_run_dir(plan: Plan, resume: bool, overwrite: bool, node_rank: int = 0) -> tuple[Path, IO]:
    """Check ``output_dir`` for this run, lock it, and write the run's config files.

    Refuses (``ConfigError`` naming ``output_dir``) a folder in use (naming the pid of its launcher), a
    folder of an earlier run that holds results (``holds_results``) without ``--resume`` or
    ``--overwrite``, and a non-empty folder ktrain did not write. A folder a failed start left is reused,
    with one line saying so. Nothing is changed before every check passed. The launcher of another
    machine than the first (``node_rank`` > 0) only joins the folder (``join_run_dir``).
    """
    config = plan.config
    out = Path(config.output_dir).expanduser().absolute()
    if node_rank:
        return out, join_run_dir(out, plan, node_rank)
    ours = (out / RUN_FILE).is_file()
    if out.exists() and not ours and not all(_joining(p.name) for p in out.iterdir()):
        raise ConfigError.single(
            "output_dir", f"{out} holds files ktrain did not write; choose an empty or new output_dir"
        )
    if resume and overwrite:
        raise ConfigError.single("--overwrite", "--resume and --overwrite contradict each other; pick one")
    continuing = resume or config.auto_resume_from_checkpoints or config.resume_from_checkpoint
    if ours and (out / LOCK_FILE).is_file():
        open_lock(out / LOCK_FILE, fcntl.LOCK_SH).close()  # in use: say so first, naming its launcher
    if ours and not (continuing or overwrite) and holds_results(out):
        raise ConfigError.single(
            "output_dir", f"{out} holds an earlier run: pass --resume to continue it or --overwrite to start afresh"
        )
    _check_continuation(out, plan, resume)
    out.mkdir(parents=True, exist_ok=True)
    lock = open_lock(out / LOCK_FILE, fcntl.LOCK_EX)
    workers = _try_lock(out / WORKER_LOCK_FILE, fcntl.LOCK_EX)
    if workers is None:
        lock.close()
        raise RunDirInUse.single("output_dir", f"ranks of an earlier run still hold {out}; stop them first")
    workers.close()
    # what another machine of this run may have written as it joined stays: the run files are written again
    # below by an atomic replace, so a joining launcher reading them never finds them missing
    joined = tuple(p.name for p in out.iterdir() if _joining(p.name))
    if overwrite and ours:
        _clear(out, keep=joined)
    elif ours and not continuing and not holds_results(out):
        print(f"ktrain: {out} holds no checkpoint and no model of an earlier start; starting afresh in it", flush=True)
        _clear(out, keep=("prepared", *joined))  # the data cache is named by its content's hash: still good
    write_run_files(out, plan)
    return out, lock


def _joining(name: str) -> bool:
    """Whether ``name`` is a file the launcher of another machine of the run writes as it joins (``join_run_dir``)."""
    return name.startswith(".ktrain.node-") or any(name == f or name.startswith(f".{f}.tmp-") for f in RUN_FILES)


def join_run_dir(out: Path, plan: Plan, node_rank: int) -> IO:
    """The launcher of machine ``node_rank`` (> 0) of a run over several: the first machine's launcher checks,
    clears and locks ``out`` (on a filesystem they share, as their checkpoints need), so this one locks
    ``.ktrain.node-N.lock`` against a second launcher of its machine and writes the config files only where
    they differ (its own disk, or a first machine that has not written them yet); returns the lock."""
    out.mkdir(parents=True, exist_ok=True)
    if not (out / RUN_FILE).is_file():  # first: a folder holding run.json is ktrain's to the first machine
        write_run_files(out, plan)
    texts = {"config.yaml": plan.config.to_yaml(only_present=True), "config.resolved.yaml": plan.config.to_yaml()}
    for name, text in texts.items():
        if not (out / name).is_file() or (out / name).read_text(encoding="utf-8") != text:
            atomic_write_text(out / name, text)
    return open_lock(out / f".ktrain.node-{node_rank}.lock", fcntl.LOCK_EX)


RUN_FILES = (RUN_FILE, "config.yaml", "config.resolved.yaml")


class Before:
    """``output_dir`` as it was before ``prepare_run_dir``: put back when a rank finds bad input.

    ``restore`` removes what this start added (the whole folder when it did not exist) and writes the run
    files back as they were, unless the run committed a checkpoint since: then what it trained is kept. An
    ``--overwrite`` start has already removed the earlier run's files.
    """

    def __init__(self, plan: Plan):
        self.out = Path(plan.config.output_dir).expanduser().absolute()
        self.existed = self.out.is_dir()
        self.names = {p.name for p in self.out.iterdir()} if self.existed else set()
        self.files = {n: (self.out / n).read_bytes() for n in RUN_FILES if (self.out / n).is_file()}
        self.checkpoints = _committed(self.out)

    def restore(self) -> None:
        """Put ``output_dir`` back as it was, unless a checkpoint was committed since."""
        if _committed(self.out) - self.checkpoints:
            return
        if not self.existed:
            shutil.rmtree(self.out, ignore_errors=True)
            return
        _clear(self.out, keep=tuple(self.names))
        for name in {LOCK_FILE, WORKER_LOCK_FILE} - self.names:
            (self.out / name).unlink(missing_ok=True)
        for name, data in self.files.items():
            (self.out / name).write_bytes(data)


def _check_continuation(out: Path, plan: Plan, resume: bool) -> None:
    """Before a rank starts: ``--resume`` needs a complete checkpoint, and a resume keeps what it cannot change."""
    from ktrain.run.resume_check import check_resume

    config = plan.config
    if config.resume_from_checkpoint:
        return
    if resume and not config.auto_resume_from_checkpoints and not has_checkpoint(out):
        raise ConfigError.single("--resume", f"no complete checkpoint in {out / CHECKPOINTS}; run without --resume")
    if (resume or config.auto_resume_from_checkpoints) and has_checkpoint(out):
        check_resume(out, config)


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
