"""The checkpoint contract, whatever the format: staged, verified, committed by one rename, resumed exactly.

A save first checks that the disk has room for it (the size of the latest checkpoint, or for the first
one the trained parameters, the buffers and the optimizer state: an adapter's frozen base is not saved).
It writes into ``checkpoints/.tmp-step-N``: the format
plugin's files (``ktrain_save_checkpoint``), then each rank's own state (RNG as the save began, plugin
state, grad scaler) as ``rank-R.pt``, then ``manifest.json`` (``ktrain.run.manifest``: format, plugin
and version, versions, plugins, config hash, world size, step, global sample index, tokens seen, and the
size and sha256 of every file). Everything is fsynced, then the folder is renamed to ``step-N`` and the folder
above fsynced: the rename is the commit marker. A kill at any moment leaves either no ``step-N`` or a
whole one; a stale ``.tmp-*`` is removed by the next save. A step saved again (after a resume from an
older checkpoint) is staged afresh and replaces the old folder by renames: no folder is written twice.
A full disk stops the save with "no space left on <path>: need N, have M" and leaves the checkpoints
before it as they were. ``save_total_limit`` keeps the newest checkpoints, never fewer than two, and the
best one besides where the run ranks them by eval loss (``ktrain.run.early_stop``).

A resume verifies the newest committed checkpoint against its manifest (every file's sha256, the files
shared out over the ranks) before anything is deserialised, and falls back to the one before, with a
warning naming the damaged file; when none is intact it stops, naming the files. On another number of
ranks the launcher has set the accumulation that keeps the checkpoint's global batch
(``ktrain.run.resume_check.keep_global_batch``), so the step and the data position hold; the format
plugin reshards the model and optimizer, and rank R reads ``rank-R.pt`` where one exists.
"""

from __future__ import annotations

import json
import random
import shutil
import sys
from pathlib import Path
from typing import Any

import torch

from ktrain import __version__
from ktrain.config.report import ConfigError
from ktrain.plugins import Plugins
from ktrain.registry import collect
from ktrain.run import distributed, manifest
from ktrain.run.context import Run
from ktrain.run.directory import CHECKPOINTS
from ktrain.run.faults import maybe_fault
from ktrain.run.files import atomic_write_text, fsync_dir, fsync_tree
from ktrain.run.manifest import MANIFEST, NoSpaceLeft

PREFIX = "step-"
KEEP_AT_LEAST = 2


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
    return run.plan.plugins.collect("ktrain_collect_checkpoint_state", "checkpoint state", run=run)


def rows_per_step(run: Run) -> int:
    """Rows of one optimizer step over all data-parallel ranks: the unit of the data position."""
    return run.config.micro_batch_size * run.config.gradient_accumulation_steps * run.mesh.dp_size


OPTIMIZER_BYTES = 12
"""Optimizer state per trained element, at most: Adam's two fp32 moments and an fp32 master copy."""
FILE_BYTES = 64 * 1024
"""Each of the small files beside the tensors, at most: a rank's file (RNG, plugin state), the schedule,
the manifest, the formats' headers."""


def first_checkpoint_bytes(model: Any, world_size: int = 1) -> int:
    """What the first checkpoint of ``model`` will hold, at most: the trained parameters (an adapter's, not
    its frozen or 4-bit base, which no format saves), the buffers, the optimizer state of the trained
    parameters (``OPTIMIZER_BYTES`` an element), and the small files (``FILE_BYTES``: one a rank, and two)."""
    trained = [p for p in model.parameters() if p.requires_grad]
    elements = sum(getattr(p, "ds_numel", p.numel()) for p in trained)
    weights = sum(getattr(p, "ds_numel", p.numel()) * p.element_size() for p in trained)
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    return weights + buffers + OPTIMIZER_BYTES * elements + FILE_BYTES * (world_size + 2)


def _space_needed(root: Path, engine: Any, world_size: int) -> int:
    """Free space a save needs: the size of the latest complete checkpoint, else ``first_checkpoint_bytes``."""
    found = complete_checkpoints(root)
    if found:
        return sum(manifest.size_of(entry) for entry in (read_manifest(found[-1]) or {}).get("files", {}).values())
    return first_checkpoint_bytes(engine.model, world_size)


def path_of(run_dir: Path, step: int) -> Path:
    """Where the checkpoint of ``step`` is committed."""
    return checkpoint_root(run_dir) / f"{PREFIX}{step:08d}"


def save(run: Run, engine: Any, step: int, trainer_state: dict[str, Any], keep: int | None = None) -> Path:
    """Save a complete checkpoint of ``step`` collectively; return its committed path. Rotation
    (``save_total_limit``) keeps the checkpoint of step ``keep`` besides the newest.

    Raises ``NoSpaceLeft`` on every rank whose disk is too small, before writing anything, and on a
    rank that meets a full disk while writing.
    """
    root = checkpoint_root(run.output_dir)
    staging = root / f".tmp-{PREFIX}{step:08d}"
    if run.is_main:
        root.mkdir(parents=True, exist_ok=True)
        for stale in root.glob(".tmp-*"):
            shutil.rmtree(stale)
    distributed.barrier()
    need = _space_needed(root, engine, run.world_size)
    try:
        manifest.ensure_space(root, need)
    except NoSpaceLeft as e:
        raise NoSpaceLeft(f"{e} (step {step} not saved; the checkpoints before it are intact)") from None
    if run.is_main:
        staging.mkdir()
    distributed.barrier()
    rng = _rng_state()  # what the next step draws from; writers (torch.save's ids) draw from it too
    try:
        return _write(run, engine, step, trainer_state, staging, rng, keep)
    except Exception as e:
        if not manifest.is_no_space(e):
            raise
        if run.is_main:
            shutil.rmtree(staging, ignore_errors=True)
        have = shutil.disk_usage(root).free
        raise NoSpaceLeft(
            f"no space left on {root}: need {manifest.human_size(need)}, have {manifest.human_size(have)} "
            f"(step {step} not saved; the checkpoints before it are intact)"
        ) from e


def _write(
    run: Run, engine: Any, step: int, trainer_state: dict[str, Any], staging: Path, rng: dict, keep: int | None
) -> Path:
    root, final = staging.parent, path_of(run.output_dir, step)
    maybe_fault("save-start", step, run.rank)
    facts = run.hook.ktrain_save_checkpoint(engine=engine, run=run, path=staging)
    if not facts or "format" not in facts:
        raise RuntimeError("the checkpoint_format owner returned no {'format': ...} from ktrain_save_checkpoint")
    maybe_fault("save-shards", step, run.rank)
    rank_state = {
        "rng": rng,
        "plugins": {name: obj.state_dict() for name, obj in _plugin_states(run).items()},
        "grad_scaler": engine.scaler.state_dict() if engine.scaler else None,
    }
    torch.save(rank_state, staging / f"rank-{run.rank}.pt")
    distributed.barrier()
    if run.is_main:
        owner = run.plan.plugins.role_owners()["checkpoint_format"].plugin
        rows = rows_per_step(run)
        record = {
            **facts,
            "plugin": owner.name,
            "plugin_distribution": owner.distribution,
            "plugin_version": owner.version,
            "ktrain": __version__,
            "versions": manifest.versions(),
            "plugins": list(
                {
                    a.plugin.name: {
                        "name": a.plugin.name,
                        "distribution": a.plugin.distribution,
                        "version": a.plugin.version,
                    }
                    for a in run.plan.plugins.activations
                }.values()
            ),
            "config_sha256": manifest.config_sha256(run.output_dir),
            "world_size": run.world_size,
            "mesh": run.mesh.dims,
            "step": step,
            "rows_per_step": rows,
            "samples_seen": step * rows,
            "tokens_seen": trainer_state.get("tokens_seen"),
            "trainer": trainer_state,
            "files": manifest.file_table(staging),
        }
        atomic_write_text(staging / MANIFEST, json.dumps(record, indent=1))
        fsync_tree(staging)
        maybe_fault("save-before-commit", step, run.rank)
        _commit(staging, final)
        maybe_fault("save-after-commit", step, run.rank)
        _prune(root, run.config.save_total_limit, keep)
    distributed.barrier()
    _set_rng_state(rng)  # a run that saved goes on exactly as one resumed from this checkpoint
    return final


def _commit(staging: Path, final: Path) -> None:
    """Rename ``staging`` to ``final``; an existing ``final`` (a step saved again) is renamed away first."""
    aside = final.with_name(f".tmp-old-{final.name}")
    if final.exists():
        final.rename(aside)
    staging.rename(final)
    fsync_dir(final.parent)
    if aside.exists():
        shutil.rmtree(aside)


def _prune(root: Path, limit: int | None, keep: int | None) -> None:
    """Remove all but the newest ``limit`` checkpoints (never fewer than two), except that of step ``keep``."""
    if not limit:
        return
    for old in complete_checkpoints(root)[: -max(limit, KEEP_AT_LEAST)]:
        if old.name != f"{PREFIX}{keep or 0:08d}":
            shutil.rmtree(old)


def read_manifest(path: Path) -> dict[str, Any] | None:
    """The manifest of a committed checkpoint, or None when it is missing, unreadable or its files are not whole.

    Compares sizes only; ``verify`` hashes every file.
    """
    return manifest.read(path)


def complete_checkpoints(root: Path) -> list[Path]:
    """Committed checkpoints under ``root`` whose files have the sizes of their manifest, oldest first."""
    return [p for p in committed_checkpoints(root) if read_manifest(p)]


def committed_checkpoints(root: Path) -> list[Path]:
    """Every ``step-N`` folder under ``root`` (committed by its rename, maybe damaged since), oldest first."""
    if not root.is_dir():
        return []
    found = [p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX) and p.name[len(PREFIX) :].isdigit()]
    return sorted(found, key=lambda p: int(p.name[len(PREFIX) :]))


def verify(path: Path, rank: int = 0, world_size: int = 1) -> list[str]:
    """What is wrong with checkpoint ``path`` against its manifest (every file hashed), or [] when intact.

    Called on every rank of a run at once: each hashes its share of the files and all learn the result.
    """
    record, problem = manifest.manifest_problem(path)
    if record is None:
        return [str(problem)]
    names = sorted(record["files"])
    mine = [p for name in names[rank::world_size] if (p := manifest.file_problem(path, name, record["files"][name]))]
    return sorted(distributed.gather_lists(mine))


def find_resume_point(run: Run, explicit: str | None, required: bool) -> Path | None:
    """The checkpoint to resume from: ``explicit``, else the newest intact one (None when there is none).

    A damaged checkpoint is passed over with a warning naming its file; when every one is damaged (or
    ``explicit`` is) the run stops with a ``ConfigError`` naming the files.
    """
    if explicit:
        path = Path(explicit)
        problems = verify(path, run.rank, run.world_size)
        if problems:
            raise ConfigError.single("resume_from_checkpoint", f"{path} cannot be resumed: {'; '.join(problems)}")
        return path
    root = checkpoint_root(run.output_dir)
    damaged = []
    for path in reversed(committed_checkpoints(root)):
        problems = verify(path, run.rank, run.world_size)
        if not problems:
            return path
        damaged += problems
        if run.is_main:
            print(f"ktrain: warning: checkpoint {path.name} is damaged: {'; '.join(problems)}", file=sys.stderr)
    if damaged:
        raise ConfigError.single("--resume", f"no intact checkpoint is left in {root}: {'; '.join(damaged)}")
    if required:
        raise ConfigError.single("--resume", f"no complete checkpoint in {root}; run without --resume")
    return None


def _check_layout(run: Run, path: Path, record: dict[str, Any]) -> None:
    """Refuse a resume whose global batch differs (the launcher kept it; an older checkpoint fallen back to may
    have another): its data position, a global sample index, would not hold."""
    rows = record.get("rows_per_step")
    if rows is not None and rows != rows_per_step(run):
        raise ConfigError.single(
            "--resume",
            f"{path} was written with {rows} rows per optimizer step (sample {record.get('samples_seen')} reached); "
            f"this run takes {rows_per_step(run)} (micro_batch_size x gradient_accumulation_steps x data-parallel "
            f"ranks), so its data position cannot be kept. Resume with a global batch of {rows} rows",
        )


def load(run: Run, engine: Any, path: Path) -> dict[str, Any]:
    """Restore model, optimizer, scheduler, RNG and plugin state from ``path`` (verified by
    ``find_resume_point``); return the trainer state."""
    record = read_manifest(path)
    if record is None:
        raise ConfigError.single("resume_from_checkpoint", f"{path} is not a complete ktrain checkpoint")
    _check_layout(run, path, record)
    run.hook.ktrain_load_checkpoint(engine=engine, run=run, path=path, manifest=record)
    rank_file = path / f"rank-{run.rank}.pt"
    if rank_file.exists():
        rank_state = torch.load(rank_file, weights_only=True)
        _set_rng_state(rank_state["rng"])
        if engine.scaler and rank_state.get("grad_scaler"):
            engine.scaler.load_state_dict(rank_state["grad_scaler"])
        for name, obj in _plugin_states(run).items():
            if name in rank_state["plugins"]:
                obj.load_state_dict(rank_state["plugins"][name])
    return record["trainer"]


def read_checkpoint_state(plugins: Plugins, path: Path) -> dict[str, Any]:
    """The whole model's state dict (CPU tensors, the names ``transformers`` uses) of committed checkpoint ``path``.

    For commands that read a checkpoint outside a run (``ktrain export``, a plugin's own): every file is
    hashed against the manifest before anything is deserialised, then the reader that
    ``ktrain_register_checkpoint_formats`` registered for the manifest's format reads it, on one process
    without a process group. Raises ``ConfigError`` on ``--checkpoint`` when the checkpoint is damaged or
    incomplete, or when the plugin of its format is not installed.
    """
    problems = verify(path)
    if problems:
        raise ConfigError.single("--checkpoint", f"{path} cannot be read: {'; '.join(problems)}")
    record = read_manifest(path) or {}
    readers = collect(plugins, "ktrain_register_checkpoint_formats", "checkpoint format")
    fmt = record.get("format", "?")
    if fmt not in readers:
        raise ConfigError.single(
            "--checkpoint",
            f"{path} is a '{fmt}' checkpoint of {record.get('plugin_distribution')}, which is not installed",
        )
    return readers.get(fmt, "format")(path, record)
