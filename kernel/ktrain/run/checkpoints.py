"""The checkpoint contract, whatever the format: staged, committed by one rename, resumed exactly.

A save writes into ``checkpoints/.tmp-step-N``: the format plugin's files (``ktrain_save_checkpoint``),
then each rank's own state (step, RNG, plugin state) as ``rank-R.pt``, then ``manifest.json`` (format,
plugin and version, world size, step, the size of every file). Everything is fsynced and the folder is
renamed to ``step-N``: a checkpoint is visible only when complete. A kill at any moment leaves either
no ``step-N`` or a whole one; a stale ``.tmp-*`` is removed by the next save.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from ktrain import __version__
from ktrain.config.report import ConfigError
from ktrain.files import atomic_write_text, fsync_dir, fsync_tree
from ktrain.run import distributed
from ktrain.run.context import Run
from ktrain.run.faults import maybe_fault
from ktrain.run_dir import CHECKPOINTS

MANIFEST = "manifest.json"
PREFIX = "step-"


def checkpoint_root(run_dir: Path) -> Path:
    return run_dir / CHECKPOINTS


def _rng_state() -> dict[str, Any]:
    state = {"python": random.getstate(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _plugin_states(run: Run) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for result in run.hook.ktrain_collect_checkpoint_state(run=run):
        for name, obj in (result or {}).items():
            if name in merged:
                raise RuntimeError(f"checkpoint state '{name}' is given by two plugins")
            merged[name] = obj
    return merged


def save(run: Run, engine: Any, step: int, trainer_state: dict[str, Any]) -> Path:
    """Save a complete checkpoint of ``step`` collectively; return its committed path."""
    root = checkpoint_root(run.output_dir)
    staging = root / f".tmp-{PREFIX}{step:08d}"
    final = root / f"{PREFIX}{step:08d}"
    if run.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale)
        staging.mkdir()
    distributed.barrier()
    facts = run.hook.ktrain_save_checkpoint(engine=engine, run=run, path=staging)
    if not facts or "format" not in facts:
        raise RuntimeError("the checkpoint_format owner returned no {'format': ...} from ktrain_save_checkpoint")
    rank_state = {
        "rng": _rng_state(),
        "plugins": {name: obj.state_dict() for name, obj in _plugin_states(run).items()},
        "grad_scaler": engine.scaler.state_dict() if engine.scaler else None,
    }
    torch.save(rank_state, staging / f"rank-{run.rank}.pt")
    distributed.barrier()
    if run.is_main:
        owner = run.plan.plugins.role_owners()["checkpoint_format"].plugin
        manifest = {
            **facts,
            "plugin": owner.name,
            "plugin_distribution": owner.distribution,
            "plugin_version": owner.version,
            "ktrain": __version__,
            "world_size": run.world_size,
            "mesh": run.mesh.dims,
            "step": step,
            "trainer": trainer_state,
            "files": {str(p.relative_to(staging)): p.stat().st_size for p in sorted(staging.rglob("*")) if p.is_file()},
        }
        atomic_write_text(staging / MANIFEST, json.dumps(manifest, indent=1))
        fsync_tree(staging)
        maybe_fault("save-before-commit", step, run.rank)
        if final.exists():  # a step saved again (a resumed run saving its first step): replace whole
            shutil.rmtree(final)
        staging.rename(final)
        fsync_dir(root)
        _prune(root, run.config.save_total_limit)
    distributed.barrier()
    return final


def _prune(root: Path, keep: int | None) -> None:
    if not keep:
        return
    for old in complete_checkpoints(root)[:-keep]:
        shutil.rmtree(old)


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a committed checkpoint, or None when it is missing, unreadable or its files are not whole."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, json.JSONDecodeError):
        return None
    for name, size in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file() or file.stat().st_size != size:
            return None
    return manifest


def complete_checkpoints(root: Path) -> list[Path]:
    """Committed checkpoints under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and read_manifest(p)]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def find_resume_point(run: Run, explicit: str | None, required: bool) -> Path | None:
    """The checkpoint to resume from: ``explicit``, else the latest complete one (None when there is none)."""
    if explicit:
        path = Path(explicit)
        if read_manifest(path) is None:
            raise ConfigError.single("resume_from_checkpoint", f"{path} is not a complete ktrain checkpoint")
        return path
    found = complete_checkpoints(checkpoint_root(run.output_dir))
    if not found and required:
        raise ConfigError.single(
            "--resume", f"no complete checkpoint in {checkpoint_root(run.output_dir)}; run without --resume"
        )
    return found[-1] if found else None


def load(run: Run, engine: Any, path: Path) -> dict[str, Any]:
    """Restore model, optimizer, scheduler, RNG and plugin state from ``path``; return the trainer state."""
    manifest = read_manifest(path)
    if manifest is None:
        raise ConfigError.single("resume_from_checkpoint", f"{path} is not a complete ktrain checkpoint")
    run.hook.ktrain_load_checkpoint(engine=engine, run=run, path=path, manifest=manifest)
    rank_file = path / f"rank-{run.rank}.pt"
    if rank_file.exists():
        rank_state = torch.load(rank_file, weights_only=False)
        _set_rng_state(rank_state["rng"])
        if engine.scaler and rank_state.get("grad_scaler"):
            engine.scaler.load_state_dict(rank_state["grad_scaler"])
        for name, obj in _plugin_states(run).items():
            if name in rank_state["plugins"]:
                obj.load_state_dict(rank_state["plugins"][name])
    return manifest["trainer"]
