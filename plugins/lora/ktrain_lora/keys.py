"""The config keys of ktrain-plugin-lora (attrs sections) and what they say about the base: no torch here."""

from __future__ import annotations

from typing import Any, Literal

import attrs

from ktrain.config.keys import key

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
    lora_target_parameters: list[str] | None = key(
        None,
        "parameters to adapt that are not linear layers, e.g. [mlp.experts.gate_up_proj] (the fused weights of "
        "mixture-of-experts layers): peft's target_parameters, matched by the end of the parameter's name",
    )
    lora_modules_to_save: list[str] | None = key(
        None, "modules trained in full beside the adapter, e.g. [embed_tokens, lm_head] after adding tokens"
    )
    lora_model_dir: str | None = key(None, "adapter folder to continue training (an earlier run's final/)")
    peft_use_dora: bool = key(False, "DoRA: a trained magnitude per output feature beside the LoRA direction")
    peft_use_rslora: bool = key(False, "rank-stabilized LoRA: scale by alpha / sqrt(r)")
    lora_fused_forward: bool = key(
        True,
        "compute a LoRA layer's update, its scale and the sum with the base's output as one matrix multiply "
        "(torch.addmm) where the layer has one adapter without dropout or DoRA; false: peft's forward",
    )


# Keys that describe a new adapter; an adapter loaded from lora_model_dir brings its own.
SHAPE_KEYS = (
    "lora_r",
    "lora_alpha",
    "lora_dropout",
    "lora_target_modules",
    "lora_target_linear",
    "lora_target_parameters",
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


def bf16_masters(config: Any) -> bool:
    """Whether the adapter's weights train in bf16, the base's dtype (``bfloat16: true``), with their fp32 masters
    and moments in the optimizer (``adamw_fp32_master``); otherwise they train in fp32."""
    return bool(config.bfloat16) and config.optimizer == "adamw_fp32_master"
