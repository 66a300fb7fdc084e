"""What tensor, context and sequence parallelism need of the model and of the other plugins.

The model's shape is read from its ``config.json`` before launch when ``base_model`` (or
``base_model_config``) is a local folder; for a hub id the same checks run on the ranks, after the
config is downloaded and before any weight is touched.
"""

from __future__ import annotations

import json
import os
from typing import Any

from ktrain.config.report import ConfigError, Report

FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


def sequence_ranks(config: Any) -> int:
    """Ranks each row's sequence is split over (context or Ulysses sequence parallelism)."""
    return max(config.context_parallel_size, config.sequence_parallel_degree)


def local_model_config(config: Any) -> dict[str, Any] | None:
    """The base model's ``config.json`` as a dict, when it is a local folder; else None."""
    source = config.base_model_config or config.base_model
    path = os.path.join(os.path.expanduser(source or ""), "config.json")
    if not source or not os.path.isfile(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def shape_problems(facts: dict[str, Any], tp: int, seq: int, ulysses: bool) -> list[tuple[str, str]]:
    """(key, message) for each way a model of config ``facts`` cannot be split as asked."""
    out: list[tuple[str, str]] = []
    kind = facts.get("model_type")
    heads = facts.get("num_attention_heads", 0)
    kv = facts.get("num_key_value_heads") or heads
    if tp > 1:
        if kind not in FAMILIES:
            out.append(
                (
                    "tensor_parallel_size",
                    f"there is no tensor-parallel plan for model_type '{kind}'; plans exist for "
                    f"{', '.join(FAMILIES)}. Use fsdp_version: 2 alone (dp_shard_size) for this model",
                )
            )
            return out
        if kv < tp or kv % tp:
            out.append(
                (
                    "tensor_parallel_size",
                    f"{tp} does not divide the model's {kv} KV heads; use a divisor of {kv} "
                    f"({', '.join(str(d) for d in range(1, kv + 1) if kv % d == 0)})",
                )
            )
        for name in ("num_attention_heads", "intermediate_size", "vocab_size"):
            value = facts.get(name, 0)
            if value % tp:
                out.append(("tensor_parallel_size", f"{tp} does not divide the model's {name} {value}"))
    if ulysses and seq > 1 and heads and (heads // max(tp, 1)) % seq:
        out.append(
            (
                "sequence_parallel_degree",
                f"Ulysses splits the {heads // max(tp, 1)} attention heads of each tensor-parallel rank over {seq} "
                f"ranks, which does not divide them; use a divisor, or context_parallel_size (any head count)",
            )
        )
    return out


def check_model(config: Any, report: Report, seq: int) -> None:
    """Add the shape problems of a local base model to ``report``."""
    facts = local_model_config(config)
    if facts is None:
        return
    for key, message in shape_problems(facts, config.tensor_parallel_size, seq, config.sequence_parallel_degree > 1):
        report.error(key, message)


def raise_shape_problems(facts: dict[str, Any], config: Any, seq: int) -> None:
    """On the ranks: raise ``ConfigError`` with every shape problem of the loaded model."""
    report = Report(config.source)
    for key, message in shape_problems(facts, config.tensor_parallel_size, seq, config.sequence_parallel_degree > 1):
        report.error(key, message)
    if report.errors:
        raise ConfigError(report)


def check_plugins(config: Any, report: Report) -> None:
    """Combinations that cannot work, each named with what would."""
    tp, seq = config.tensor_parallel_size, sequence_ranks(config)
    if tp <= 1 and seq <= 1:
        return
    which = (
        "tensor_parallel_size"
        if tp > 1
        else "sequence_parallel_degree"
        if config.sequence_parallel_degree > 1
        else "context_parallel_size"
    )
    if getattr(config, "deepspeed", None) is not None:
        report.error(
            which,
            "does not compose with deepspeed: DeepSpeed's engine neither takes DTensor parameters nor averages "
            "gradients over sequence shards here; use fsdp_version: 2 for the data-parallel dimension",
        )
    if tp > 1 and getattr(config, "fsdp_version", None) != 2:
        report.error(
            "tensor_parallel_size",
            "needs fsdp_version: 2: tensor-parallel weights are DTensors, which FSDP2 shards on top (2-D) and saves "
            "through torch.distributed.checkpoint; the kernel's DDP and full-state checkpoints do not take them",
        )
    if tp > 1 and getattr(config, "adapter", None):
        report.error("tensor_parallel_size", "does not compose with adapter (LoRA/QLoRA) here; use FSDP2 alone")
    liger = sorted(name for name in config.present if name.startswith("liger_") and getattr(config, name) is True)
    if tp > 1 and liger:
        report.error(
            liger[0], "Liger's kernels take plain tensors, not the DTensors of tensor parallelism; remove it or tp"
        )
    if seq > 1:
        wanted = config.attn_implementation or ("flex_attention" if config.flex_attention else None)
        if wanted == "flex_attention":
            report.error(
                "attn_implementation" if config.attn_implementation else "flex_attention",
                "context/sequence parallelism computes attention with SDPA on the gathered sequence; flex_attention's "
                "block masks cover one whole sequence. Use sdpa (the default)",
            )
