"""The quantized base: bitsandbytes settings from the keys, and a CPU behaviour of bitsandbytes turned off.

bitsandbytes 0.50 repacks a 4-bit weight into a CPU inference layout the first time the layer runs in
eval mode without gradients (an evaluation, the exact-match score) on a CPU with AVX512-BF16. Training
forwards after that go through ``gemv_4bit``, which has no autograd formula: the adapter's gradients
come out wrong, silently (``plugins/lora/tests/test_lora_quantization.py`` shows it). ``keep_training_layout`` turns
the repacking off for every 4-bit layer of the model.
"""

from __future__ import annotations

from typing import Any

import torch
import transformers

from ktrain_lora.keys import BnbConfigKwargs, quantization_bits

DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32, "uint8": torch.uint8}


def storage_dtype(config: Any, compute_dtype: torch.dtype) -> torch.dtype:
    """The dtype the packed 4-bit weights are stored as: the compute dtype, or bf16 in fp32 runs.

    A sharding plugin gathers parameters in the compute dtype: storage of that dtype is gathered as
    it is, byte for byte.
    """
    chosen = (config.bnb_config_kwargs or BnbConfigKwargs()).bnb_4bit_quant_storage
    if chosen is not None:
        return DTYPES[chosen]
    return compute_dtype if compute_dtype in (torch.bfloat16, torch.float16) else torch.bfloat16


def bnb_config(config: Any, compute_dtype: torch.dtype) -> transformers.BitsAndBytesConfig | None:
    """The ``BitsAndBytesConfig`` of the base, or None when the base is not quantized."""
    bits = quantization_bits(config)
    if bits is None:
        return None
    bnb = config.bnb_config_kwargs or BnbConfigKwargs()
    if bits == 8:
        return transformers.BitsAndBytesConfig(
            load_in_8bit=True,
            llm_int8_threshold=bnb.llm_int8_threshold,
            llm_int8_skip_modules=bnb.llm_int8_skip_modules,
        )
    return transformers.BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=bnb.bnb_4bit_quant_type,
        bnb_4bit_use_double_quant=bnb.bnb_4bit_use_double_quant,
        bnb_4bit_compute_dtype=DTYPES[bnb.bnb_4bit_compute_dtype] if bnb.bnb_4bit_compute_dtype else compute_dtype,
        bnb_4bit_quant_storage=storage_dtype(config, compute_dtype),
        llm_int8_skip_modules=bnb.llm_int8_skip_modules,
    )


def model_kwargs(config: Any, compute_dtype: torch.dtype) -> dict[str, Any] | None:
    """``from_pretrained`` keywords of a quantized base, or None for a full-precision base.

    ``quantization_config``, and ``dtype``: the compute dtype for the parts bitsandbytes leaves
    unquantized (embeddings, norms, the output layer). They are frozen, so they need no fp32 master
    copy; the adapter's own weights are made fp32 when it is attached.
    """
    quantization = bnb_config(config, compute_dtype)
    return None if quantization is None else {"quantization_config": quantization, "dtype": compute_dtype}


def keep_training_layout(model: torch.nn.Module) -> int:
    """Stop bitsandbytes repacking 4-bit weights for CPU inference (see the module docstring); return the count."""
    import bitsandbytes as bnb

    layers = [m for m in model.modules() if isinstance(m, bnb.nn.Linear4bit)]
    for layer in layers:
        layer.support_avx512bf16_for_cpu = False
    return len(layers)
