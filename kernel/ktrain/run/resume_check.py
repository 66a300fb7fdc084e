"""What a resume cannot change: checked in the launching process against the run directory, before any rank starts.

A resume continues at a global sample index of the same shuffled rows, with tensors of the shapes the
checkpoint holds. A key that changes which rows there are, their order or their tokens (``datasets``,
``sequence_len``, packing, the seed, ...), or the shapes of the sharded tensors (the tensor-, context-
and sequence-parallel sizes), would make the resumed run train on other data than the one it continues,
or fail to load. ``micro_batch_size`` changes the rows of every rank's micro-batch. The data-parallel
sizes and ``gradient_accumulation_steps`` may change where the global batch stays the same (the
checkpoint's rows per step are compared on the ranks, and DCP reshards). docs/reliability.md lists the keys.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from ktrain.config.report import ConfigError, Report

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
