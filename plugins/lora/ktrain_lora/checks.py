"""Checks between the adapter keys, the quantization of the base and who shards it (``ktrain check``; no torch).

Each problem names its key and says what to write instead.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ktrain_lora.keys import SHAPE_KEYS, adapter_kind, quantization_bits


def validate(config: Any, report: Any) -> None:
    """Adapter, quantization and sharding combinations; every message says what to write instead."""
    kind = adapter_kind(config)
    if kind is None:
        _check_without_adapter(config, report)
        return
    if config.qlora and config.adapter == "lora":
        report.error("qlora", "qlora: true asks for adapter: qlora, but adapter is lora; keep one of them")
    if kind == "qlora":
        if config.load_in_8bit:
            report.error("load_in_8bit", "QLoRA's base is 4-bit; remove load_in_8bit (or use adapter: lora)")
        if config.is_set("load_in_4bit") and not config.load_in_4bit:
            report.error("load_in_4bit", "adapter: qlora quantizes the base to 4 bits; remove load_in_4bit: false")
    elif config.load_in_4bit:
        report.error("load_in_4bit", "LoRA on a 4-bit base is QLoRA: write adapter: qlora")
    elif config.load_in_8bit and config.peft_use_dora:
        report.error(
            "peft_use_dora",
            "DoRA on an 8-bit base fails from its second step (peft 0.21 and bitsandbytes 0.50 lose the int8 "
            "scales); use adapter: qlora or a full-precision base for DoRA",
        )
    _check_numbers(config, report)
    _check_adapter_dir(config, report)
    _check_quantization(config, report)
    _check_sharding(config, report)
    _check_new_tokens(config, report)


def _check_new_tokens(config: Any, report: Any) -> None:
    """New tokens get new embedding rows, which the frozen base keeps at their first values unless trained."""
    saved = set(config.lora_modules_to_save or ())
    if config.tokens and not {"embed_tokens", "lm_head"} <= saved:
        report.error(
            "tokens",
            "adds tokens whose new embedding rows an adapter does not train; add lora_modules_to_save: "
            "[embed_tokens, lm_head] (or train without new tokens)",
        )


def _check_without_adapter(config: Any, report: Any) -> None:
    for name, bits in (("load_in_4bit", "4-bit"), ("load_in_8bit", "8-bit")):
        if getattr(config, name):
            wanted = "qlora" if bits == "4-bit" else "lora"
            report.error(
                name, f"a {bits} base cannot be trained in full; add adapter: {wanted} to train an adapter on it"
            )
    for name in (*SHAPE_KEYS, "lora_model_dir", "bnb_config_kwargs", "lora_fused_forward"):
        if config.is_set(name):
            report.warn(name, "has no effect without an adapter; add adapter: lora (or qlora)")


def _check_numbers(config: Any, report: Any) -> None:
    if config.lora_r < 1:
        report.error("lora_r", f"must be at least 1, not {config.lora_r}")
    if config.lora_alpha <= 0:
        report.error("lora_alpha", f"must be positive, not {config.lora_alpha}")
    if not 0 <= config.lora_dropout < 1:
        report.error("lora_dropout", f"must be in [0, 1), not {config.lora_dropout}")
    if config.lora_target_modules is not None and not config.lora_target_modules:
        report.error("lora_target_modules", "is empty: name the modules to adapt, or set lora_target_linear: true")


def _check_adapter_dir(config: Any, report: Any) -> None:
    folder = config.lora_model_dir
    if folder is None:
        return
    if not os.path.isfile(os.path.join(os.path.expanduser(folder), "adapter_config.json")):
        report.error("lora_model_dir", f"{folder} holds no adapter_config.json; give a folder written by peft")
        return
    for name in SHAPE_KEYS:
        if config.is_set(name):
            report.warn(name, "has no effect: the adapter in lora_model_dir brings its own (adapter_config.json)")


def _check_quantization(config: Any, report: Any) -> None:
    bits = quantization_bits(config)
    bnb = config.bnb_config_kwargs
    if bnb is None:
        return
    if bits is None:
        report.warn("bnb_config_kwargs", "has no effect: the base is not quantized (adapter: qlora or load_in_8bit)")
    if bnb.llm_int8_threshold <= 0:
        report.error("bnb_config_kwargs.llm_int8_threshold", f"must be positive, not {bnb.llm_int8_threshold}")
    if bnb.bnb_4bit_compute_dtype == "float16" and config.bf16 is True:
        report.error("bnb_config_kwargs.bnb_4bit_compute_dtype", "is float16 in a bf16 run; use bfloat16 or leave out")


def sharded_by(config: Any) -> str | None:
    """``FSDP``, ``ZeRO-3``, ``ZeRO-1/2`` or None: who shards the model in this config (read, not imported)."""
    if any(config.is_set(name) for name in ("fsdp_version", "fsdp_config", "fsdp")):
        return "FSDP"
    if config.is_set("deepspeed"):
        stage = _zero_stage(config.deepspeed)
        return "ZeRO-3" if stage == 3 else "ZeRO-1/2"
    return None


def _zero_stage(deepspeed: Any) -> int | None:
    """The ZeRO stage of a ``deepspeed:`` mapping or JSON file; None when it cannot be read (its plugin says why)."""
    if isinstance(deepspeed, str):
        try:
            deepspeed = json.loads(Path(deepspeed).expanduser().read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
    if not isinstance(deepspeed, dict):
        return None
    stage = (deepspeed.get("zero_optimization") or {}).get("stage")
    return stage if isinstance(stage, int) else None


def _check_sharding(config: Any, report: Any) -> None:
    sharder = sharded_by(config)
    bits = quantization_bits(config)
    if sharder not in ("FSDP", "ZeRO-3") or bits is None:
        return
    if sharder == "ZeRO-3" and config.random_init_weights:
        report.error(
            "random_init_weights",
            "ZeRO-3 builds random weights already partitioned across ranks, where they cannot be quantized; "
            "save the random model (save_pretrained) and give its folder as base_model, or use FSDP",
        )
    if bits == 8:
        if sharder == "FSDP":
            report.error(
                "load_in_8bit",
                "FSDP cannot shard 8-bit bitsandbytes weights (their int8 scales are lost when sharded); "
                "use adapter: qlora, whose 4-bit weights it shards, or DeepSpeed ZeRO",
            )
        return
    storage = config.bnb_config_kwargs.bnb_4bit_quant_storage if config.bnb_config_kwargs else None
    if storage is None:
        return
    compute = "bfloat16" if config.bf16 is True else "float16" if config.fp16 else None
    if compute and storage not in (compute, "uint8"):
        report.error(
            "bnb_config_kwargs.bnb_4bit_quant_storage",
            f"{sharder} gathers floating-point parameters in the compute dtype ({compute}), which would cast "
            f"{storage} 4-bit storage and destroy the packed weights; use {compute} (or leave it out)",
        )
