"""Checks between ``deepspeed:`` and the rest of the config, before any rank starts (no torch, no DeepSpeed).

Each problem is reported at ``deepspeed.<json path>`` (or the ktrain key it concerns), and its message
names the JSON, the ktrain key and what to do. DeepSpeed's own check of its keys is in ``schema``.
"""

from __future__ import annotations

import importlib.metadata
from typing import Any

from ktrain_deepspeed import links, zero
from ktrain_deepspeed.source import Source, SourceError, read

ADAMW = ("adamw_torch", "adamw_torch_fused", "adamw")
MESH_KEYS = {
    "dp_replicate_size": "replicas",
    "tensor_parallel_size": "tensor parallelism",
    "context_parallel_size": "context parallelism",
}


def validate(config: Any, report: Any) -> None:
    """Read ``deepspeed:`` when it is written and check it against the rest of the config (DeepSpeed's own check
    of its keys follows in the entry module)."""
    if config.deepspeed is None:
        return
    try:
        source = read(config.deepspeed)
    except SourceError as e:
        report.error("deepspeed", str(e))
        return
    check(source, config, report)


def check(source: Source, config: Any, report: Any) -> None:
    """Report every problem of ``source`` against ``config``; warn about ktrain keys it makes idle."""
    settings, origin = source.settings, source.origin
    _check_stage(settings, origin, report)
    facts = links.Facts(total_steps=config.max_steps)
    for path, message in links.check(settings, config, facts, origin):
        report.error(f"deepspeed.{path}", message)
    _check_mesh(config, report)
    _check_optimizer(settings, config, origin, report)
    if config.bfloat16:
        report.error(
            "bfloat16",
            "pure bf16 weights are not ktrain's under deepspeed: DeepSpeed's bf16 keeps fp32 master weights of "
            "its own; write bf16: true instead (or drop deepspeed for pure bf16)",
        )
    legacy = zero.legacy_compile(settings)
    if legacy is not None:
        what = (
            f"compiles the model with torch.compile(backend={legacy.backend!r})"
            if legacy.enabled
            else "compiles nothing"
        )
        report.warn(
            "deepspeed.compile",
            f"{origin} uses DeepSpeed's older compile keys ({', '.join(sorted(settings['compile']))}), which "
            f"DeepSpeed {importlib.metadata.version('deepspeed')} rejects; ktrain reads them as they were meant "
            f"and {what}",
        )


def _check_stage(settings: dict[str, Any], origin: str, report: Any) -> None:
    stage = zero.stage(settings)
    if stage in (1, 2, 3) and not isinstance(stage, bool):
        return
    if stage == 0:
        report.error(
            "deepspeed.zero_optimization.stage",
            f"{origin} sets no ZeRO stage (DeepSpeed's default, 0, is plain data parallelism: without deepspeed, "
            "ktrain runs DDP); set zero_optimization.stage to 1, 2 or 3",
        )
    else:
        report.error("deepspeed.zero_optimization.stage", f"is {stage!r} in {origin}; write 1, 2 or 3")


def _check_mesh(config: Any, report: Any) -> None:
    for key, what in MESH_KEYS.items():
        if getattr(config, key) != 1:
            report.error(
                key,
                f"is {getattr(config, key)}, but DeepSpeed ZeRO shards over every rank and ktrain gives it no {what}; "
                f"set {key}: 1 with deepspeed (or use ktrain-plugin-fsdp for a mesh)",
            )


def _check_optimizer(settings: dict[str, Any], config: Any, origin: str, report: Any) -> None:
    if "optimizer" in settings:
        if config.is_set("optimizer"):
            kind = links.get(settings, "optimizer.type")
            report.warn("optimizer", f"has no effect: {origin} names its own optimizer ({kind}); remove one")
    elif zero.offloads_optimizer(settings) and zero.forces_ds_cpu_optimizer(settings) and config.optimizer not in ADAMW:
        report.error(
            "optimizer",
            f"is {config.optimizer}, but {origin} offloads the optimizer, which DeepSpeed steps with its CPU Adam "
            f"(ktrain uses it for {', '.join(ADAMW)}); choose one of those, or set "
            f'"zero_force_ds_cpu_optimizer": false in the JSON to step {config.optimizer} on the CPU',
        )
    if "scheduler" in settings:
        idle = ["lr_scheduler", "cosine_min_lr_ratio"]
        if links.get(settings, "scheduler.params.warmup_num_steps") != links.AUTO:
            idle += ["warmup_steps", "warmup_ratio"]
        for key in idle:
            if config.is_set(key):
                report.warn(key, f"has no effect: {origin} names its own scheduler; remove one")
