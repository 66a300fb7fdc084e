"""What a resume cannot change: checked in the launching process against the run directory, before any rank starts.

A resume continues at a global sample index of the same shuffled rows, with tensors of the shapes the
checkpoint holds. A key that changes which rows there are, their order or their tokens (``datasets``,
``sequence_len``, packing, the seed, ...), or the shapes of the sharded tensors (the tensor-, context-
and sequence-parallel sizes), would make the resumed run train on other data than the one it continues,
or fail to load. ``micro_batch_size`` changes the rows of every rank's micro-batch.

The number of data-parallel ranks may change (a job requeued onto fewer or more nodes): the global batch
of the checkpoint (its ``rows_per_step``) is kept by setting ``gradient_accumulation_steps`` to what
makes it with the new ranks (``keep_global_batch``), so the data position, a global sample index, and
the schedule hold; where no accumulation can make it, the resume is refused before any rank starts.
``gradient_accumulation_steps`` changed at the same number of ranks is refused too: it would change the
global batch. docs/reliability.md lists the keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ktrain.config.report import ConfigError, Report
from ktrain.run import manifest

FIXED_ON_RESUME = (
    "datasets",
    "val_set_size",
    "test_datasets",
    "sequence_len",
    "micro_batch_size",
    "sample_packing",
    "sample_packing_method",
    "pad_to_sequence_len",
    "train_on_inputs",
    "shuffle_merged_datasets",
    "chat_template",
    "chat_template_jinja",
    "special_tokens",
    "tokens",
    "seed",
    "tensor_parallel_size",
    "context_parallel_size",
    "sequence_parallel_degree",
)
"""Keys a resume must keep as the run directory's ``config.resolved.yaml`` has them."""


def _show(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000).strip()
    text = text.removesuffix("...").strip()
    return text if len(text) <= 60 else text[:57] + "..."


def check_resume(out: Path, config: Any) -> None:
    """Raise ``ConfigError`` naming, one a line, every key of ``FIXED_ON_RESUME`` whose value ``config``
    changes against the run in ``out`` (its ``config.resolved.yaml``); nothing to compare without that file."""
    saved_file = out / "config.resolved.yaml"
    if not saved_file.is_file():
        return
    saved = yaml.safe_load(saved_file.read_text(encoding="utf-8")) or {}
    now = yaml.safe_load(config.to_yaml()) or {}
    changed = [k for k in FIXED_ON_RESUME if (k in saved or k in now) and saved.get(k) != now.get(k)]
    if changed:
        report = Report(f"--resume of {out}")
        for key in changed:
            report.error(
                key,
                f"{_show(now.get(key))} here, {_show(saved.get(key))} in the run being resumed: a resume cannot change "
                "it (it changes the data order or the tensors' shapes); set it back, or start afresh with --overwrite",
            )
        raise ConfigError(report)


def _resume_point(config: Any, resume: bool, overwrite: bool) -> Path | None:
    """The checkpoint a start will resume: ``resume_from_checkpoint``, else with ``--resume`` or
    ``auto_resume_from_checkpoints`` the newest whose files have their manifest's sizes; None for a fresh start."""
    if config.resume_from_checkpoint:
        return Path(config.resume_from_checkpoint)
    if overwrite or not (resume or config.auto_resume_from_checkpoints):
        return None
    root = Path(config.output_dir).expanduser().absolute() / "checkpoints"
    steps = [p for p in root.glob("step-*") if p.name[len("step-") :].isdigit()] if root.is_dir() else []
    complete = [p for p in steps if manifest.read(p)]
    return max(complete, key=lambda p: int(p.name[len("step-") :]), default=None)


def keep_global_batch(plan: Any, resume: bool, overwrite: bool) -> tuple[int, str] | None:
    """The ``gradient_accumulation_steps`` that keeps the global batch of the checkpoint a start resumes, and
    the line that says so, when the number of data-parallel ranks changed it; None when nothing changes.

    Raises ``ConfigError`` (before any rank starts) when no accumulation makes the checkpoint's rows per
    step on these ranks, and when ``gradient_accumulation_steps`` alone changed it. A key of
    ``FIXED_ON_RESUME`` changed is reported first (``check_resume``).
    """
    config = plan.config
    path = _resume_point(config, resume, overwrite)
    record = manifest.read(path) if path is not None else None
    if record is None or not record.get("rows_per_step") or not record.get("mesh"):
        return None
    if not config.resume_from_checkpoint:
        check_resume(path.parent.parent, config)
    rows, micro, ranks = record["rows_per_step"], config.micro_batch_size, plan.mesh.dp_size
    accumulation = config.gradient_accumulation_steps
    if micro * accumulation * ranks == rows:
        return None
    saved_ranks = record["mesh"].get("dp_replicate", 1) * record["mesh"].get("dp_shard", 1)
    written = f"{path} was trained with a global batch of {rows} rows a step on {saved_ranks} data-parallel ranks"
    if saved_ranks == ranks:
        raise ConfigError.single(
            "gradient_accumulation_steps",
            f"{accumulation} here makes {micro * accumulation * ranks} rows a step; {written}, and a resume keeps "
            f"it (its data position and schedule count in it). Set it back to {rows // (micro * ranks)}, or start "
            "afresh with --overwrite",
        )
    if rows % (micro * ranks):
        raise ConfigError.single(
            "--resume",
            f"{written}; {ranks} data-parallel ranks of micro_batch_size {micro} cannot make {rows} rows by "
            f"gradient accumulation. Resume on a number of data-parallel ranks that divides {rows // micro}",
        )
    kept = rows // (micro * ranks)
    note = (
        f"resuming {path.name} on {ranks} data-parallel ranks instead of {saved_ranks}: gradient_accumulation_steps "
        f"{accumulation} -> {kept} keeps its global batch of {rows} rows"
    )
    return kept, note
