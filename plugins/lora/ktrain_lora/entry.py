"""Entry module of ktrain-plugin-lora: the adapter keys, their checks, and ``ktrain merge-lora``.

Imports nothing heavy: peft, bitsandbytes and torch are imported by the runtime object
(``ktrain_lora.runtime``), which is activated only when the config asks for an adapter.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Literal

import attrs

from ktrain import hookimpl
from ktrain.config.keys import key

KTRAIN_ROLES = ("export",)

DTYPES = Literal["bfloat16", "float16", "float32"]


@attrs.define(kw_only=True)
class BnbConfigKwargs:
    """``bnb_config_kwargs``: how bitsandbytes quantizes the frozen base."""

    bnb_4bit_quant_type: Literal["nf4", "fp4"] = key("nf4", "4-bit data type: nf4 (normal float 4) or fp4")
    bnb_4bit_use_double_quant: bool = key(True, "quantize the per-block scales too (about 0.4 bit per weight less)")
    bnb_4bit_compute_dtype: DTYPES | None = key(None, "dtype of the 4-bit matmuls (default: the run's compute dtype)")
    bnb_4bit_quant_storage: Literal["uint8", "bfloat16", "float16", "float32"] | None = key(
        None,
        "dtype the packed 4-bit weights are stored as (default: the compute dtype, bfloat16 in fp32 runs): "
        "FSDP and ZeRO-3 shard and gather them as this dtype",
    )
    llm_int8_threshold: float = key(6.0, "8-bit: activations above this stay in 16 bits (outlier features)")
    llm_int8_skip_modules: list[str] | None = key(None, "modules left unquantized (default: the output layer)")


@attrs.define(kw_only=True)
class LoraKeys:
    """Adapters: LoRA on a full-precision (or 8-bit) base, QLoRA on a 4-bit base, DoRA and rsLoRA variants."""

    adapter: Literal["lora", "qlora"] | None = key(
        None, "train an adapter instead of every weight: lora, or qlora (LoRA on a 4-bit base)"
    )
    qlora: bool = key(False, "older spelling of adapter: qlora")
    load_in_4bit: bool = key(False, "quantize the frozen base to 4 bits (what adapter: qlora does)")
    load_in_8bit: bool = key(False, "quantize the frozen base to 8 bits (adapter: lora)")
    bnb_config_kwargs: BnbConfigKwargs | None = key(None, "bitsandbytes options of the quantized base")
    lora_r: int = key(8, "rank of the adapter matrices")
    lora_alpha: int = key(16, "adapter scale: the update is multiplied by alpha / r (alpha / sqrt(r) with rsLoRA)")
    lora_dropout: float = key(0.0, "dropout on the adapter's input")
    lora_target_modules: list[str] | str | None = key(
        None, "names of the modules to adapt, or one regex (default: peft's choice for the architecture)"
    )
    lora_target_linear: bool = key(False, "adapt every linear layer except the output layer")
    lora_modules_to_save: list[str] | None = key(
        None, "modules trained in full beside the adapter, e.g. [embed_tokens, lm_head] after adding tokens"
    )
    lora_model_dir: str | None = key(None, "adapter folder to continue training (an earlier run's final/)")
    peft_use_dora: bool = key(False, "DoRA: a trained magnitude per output feature beside the LoRA direction")
    peft_use_rslora: bool = key(False, "rank-stabilized LoRA: scale by alpha / sqrt(r)")


# Keys that describe a new adapter; an adapter loaded from lora_model_dir brings its own.
SHAPE_KEYS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_target_linear",
    "lora_modules_to_save",
    "peft_use_dora",
    "peft_use_rslora",
)
ADAPTER_KEYS = ("adapter", "qlora", "lora_model_dir", *SHAPE_KEYS)


def adapter_kind(config: Any) -> str | None:
    """``lora``, ``qlora`` or None: ``adapter``, or the guides' spelling ``qlora: true``."""
    return config.adapter or ("qlora" if config.qlora else None)


def quantization_bits(config: Any) -> int | None:
    """4 or 8 when the frozen base is quantized, else None."""
    if adapter_kind(config) == "qlora" or config.load_in_4bit:
        return 4
    return 8 if config.load_in_8bit else None


@hookimpl
def ktrain_register_config(register) -> None:
    register(LoraKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
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
    for name in (*SHAPE_KEYS, "lora_model_dir", "bnb_config_kwargs"):
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


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """The adapter takes part when ``adapter`` (or ``qlora: true``) is written."""
    if adapter_kind(config) is None:
        return
    from ktrain_lora.runtime import Lora

    keys = tuple(name for name in ("adapter", "qlora", "load_in_4bit", "load_in_8bit") if config.is_set(name))
    activate(Lora(config), roles=KTRAIN_ROLES, keys=keys)


@hookimpl
def ktrain_register_commands(register) -> None:
    register("merge-lora", "merge a run's adapter into its base: safetensors transformers loads", _configure, _merge)


def _configure(parser: Any) -> None:
    parser.add_argument("run_dir", help="output_dir of an adapter run")
    parser.add_argument("--checkpoint", help="merge this checkpoint's adapter instead of the final one (final/)")
    parser.add_argument("--output", help="folder to write (default: RUN_DIR/merged)")
    parser.add_argument(
        "--dtype",
        choices=("float32", "bfloat16", "float16"),
        help="dtype of the merged weights (default: bfloat16 for bf16 runs, float16 for fp16, else float32)",
    )


def _merge(args: Any) -> int:
    from ktrain_lora.merge import merge_cli

    return merge_cli(args.run_dir, args.checkpoint, args.output, args.dtype)
