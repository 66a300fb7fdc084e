"""Entry module of ktrain-plugin-qat: Axolotl's ``qat`` key, checked here, trained by the runtime object.

Imports nothing heavy: torchao is imported by ``ktrain_qat.runtime``, activated only when ``qat`` is set.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_qat.keys import SUPPORTED, QatKeys


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``qat``."""
    register(QatKeys)


def _pairs() -> str:
    return "; ".join(f"weight_dtype {w} with activation_dtype {a or 'none'}" for w, a in SUPPORTED)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """A type pair or group size the plugin does not fake-quantize; ``qat`` beside an adapter, a quantized base
    or fp8 matmuls (each replaces the same linear layers); a negative ``fake_quant_after_n_steps``; nvfp4 in fp16."""
    qat = config.qat
    if qat is None:
        return
    pair = (qat.weight_dtype, qat.activation_dtype)
    if pair not in SUPPORTED:
        report.error(
            "qat.weight_dtype",
            f"{qat.weight_dtype} weights with activation_dtype {qat.activation_dtype or 'none'} are not supported by "
            f"ktrain-plugin-qat; these are: {_pairs()}",
        )
    elif SUPPORTED[pair] is not None and qat.group_size not in (None, SUPPORTED[pair]):
        size = SUPPORTED[pair]
        report.error("qat.group_size", f"{qat.weight_dtype} quantizes blocks of {size}: set {size} or leave it out")
    elif qat.group_size is not None and qat.group_size < 1:
        report.error("qat.group_size", f"must be at least 1, not {qat.group_size}")
    if qat.fake_quant_after_n_steps is not None and qat.fake_quant_after_n_steps < 0:
        report.error("qat.fake_quant_after_n_steps", f"must be at least 0, not {qat.fake_quant_after_n_steps}")
    if qat.weight_dtype == "mxfp4" and qat.fake_quant_after_n_steps:
        report.error(
            "qat.fake_quant_after_n_steps", "is not supported with mxfp4 weights (torchao's mxfp4 layers always round)"
        )
    if qat.weight_dtype == "nvfp4" and getattr(config, "fp16", None):
        report.error(
            "qat.weight_dtype", "nvfp4 rounds float32 or bfloat16 weights (torchao's NVFP4Tensor): use bf16, not fp16"
        )
    if qat.weight_dtype != "int4" and qat.quantize_embedding:
        report.error("qat.quantize_embedding", "is supported with int4 weights only")
    for name in ("adapter", "load_in_4bit", "load_in_8bit", "fp8"):
        if getattr(config, name, None):
            report.error(
                "qat",
                f"does not combine with {name}: both replace the linear layers; quantization-aware training "
                "trains the full model",
            )


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Fake-quantize the model's linear layers when ``qat`` is set."""
    if config.qat is None:
        return
    activate("ktrain_qat.runtime:FakeQuantizer", keys=("qat",))
