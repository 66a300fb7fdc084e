"""The weights of a LoRA or QLoRA run: the plugin's answer to ``ktrain_collect_memory``. No torch here.

The base is frozen: no gradient, no optimizer state. Each adapted linear layer of ``out`` x ``in``
gains two trained matrices, A (r x in) and B (out x r), and DoRA a magnitude of ``out``: fp32, or bf16 with
fp32 masters in the optimizer (``bf16_masters``). The
layers adapted are those ``lora_target_linear`` and ``lora_target_modules`` name, or peft's default
for Llama-family models (q_proj and v_proj). ``lora_modules_to_save`` trains a copy of each named
module beside its frozen original. Under 4-bit quantization every linear layer of the blocks is
packed two weights a byte into a column of the storage dtype's elements (bitsandbytes' layout, which
FSDP shards by rows), with a scale per 64 weights (one
byte under double quantization, which adds an fp32 scale per 256 scales, a 256-entry fp32 code table
and an fp32 offset; four bytes without) and the data type's 16-entry fp32 code table; the rest of the
base loads in the compute dtype. Under 8-bit, a byte a weight and an fp32 scale per row.
"""

from __future__ import annotations

import math
import re
from typing import Any

import attrs

from ktrain.memory.parts import Weight
from ktrain_lora.keys import adapter_kind, bf16_masters, quantization_bits

PEFT_DEFAULT_TARGETS = ("q_proj", "v_proj")
BLOCK = 64
SCALES_BLOCK = 256
"""Scales a second-level scale covers under double quantization."""
CODE_BYTES = 16 * 4
"""The 4-bit data type's code table (nf4 or fp4), fp32, kept by every quantized weight."""
NESTED_BYTES = 256 * 4 + 4
"""Double quantization's 8-bit code table of the scales and their offset, fp32, kept by every weight."""
STORAGE_BYTES = {"uint8": 1, "bfloat16": 2, "float16": 2, "float32": 4}
"""Bytes of an element of ``bnb_4bit_quant_storage``; unset, the compute dtype or bfloat16: 2."""


def _module(name: str) -> str:
    """``model.layers.0.self_attn.q_proj`` of ``model.layers.0.self_attn.q_proj.weight``."""
    return name.rsplit(".", 1)[0]


def targeted(config: Any, module: str) -> bool:
    """Whether the linear layer ``module`` (its full name) gets an adapter."""
    named = config.lora_target_modules
    if isinstance(named, str):
        return re.fullmatch(named, module) is not None
    short = module.rsplit(".", 1)[-1]
    names = set(named or ())
    if config.lora_target_linear:
        return True
    return short in (names or set(PEFT_DEFAULT_TARGETS))


def packed(w: Weight, bits: int, double_quant: bool, storage_bytes: int = 2) -> Weight:
    """``w`` as bitsandbytes stores it quantized to ``bits``: 8-bit as it was shaped; 4-bit as a column of
    elements of ``storage_bytes`` (what a sharding divides), its quantization state as ``extra_bytes``."""
    if bits == 8:
        return attrs.evolve(w, element_bytes=1, extra_bytes=4 * w.shape[0], trainable=False)
    stored = math.ceil(math.ceil(w.numel / 2) / storage_bytes)
    blocks = math.ceil(w.numel / BLOCK)
    nested = math.ceil(blocks / SCALES_BLOCK)
    scales = blocks + 4 * nested + NESTED_BYTES if double_quant else 4 * blocks
    return attrs.evolve(
        w, shape=(stored, 1), element_bytes=storage_bytes, extra_bytes=scales + CODE_BYTES, trainable=False
    )


@attrs.frozen
class AdapterWeights:
    """The ``"weights"`` model: freezes (and packs) the base and adds the adapters' trained tensors."""

    config: Any
    bits: int
    rest_bytes: float

    def __call__(self, weights: list[Weight]) -> list[Weight]:
        """The run's tensors: the frozen base, then each adapter, then the trained copies."""
        c = self.config
        keep = set(c.lora_modules_to_save or ())
        double = c.bnb_config_kwargs.bnb_4bit_use_double_quant if c.bnb_config_kwargs else True
        storage = c.bnb_config_kwargs.bnb_4bit_quant_storage if c.bnb_config_kwargs else None
        trained = 2 if bf16_masters(c) else 4
        out: list[Weight] = []
        adapters: list[Weight] = []
        for w in weights:
            if self.bits and w.kind == "linear":
                out.append(packed(w, self.bits, double, STORAGE_BYTES.get(storage or "", 2)))
            else:
                element = self.rest_bytes if self.bits else w.element_bytes
                out.append(attrs.evolve(w, element_bytes=element, trainable=False))
            module = _module(w.name)
            if w.kind == "linear" and targeted(c, module):
                rows, cols = w.shape
                adapters.append(Weight(f"{module}.lora_A.weight", (c.lora_r, cols), "adapter", w.block, trained))
                adapters.append(Weight(f"{module}.lora_B.weight", (rows, c.lora_r), "adapter", w.block, trained))
                if c.peft_use_dora:
                    adapters.append(Weight(f"{module}.lora_magnitude_vector", (rows,), "adapter", w.block, trained))
            if module.rsplit(".", 1)[-1] in keep:
                adapters.append(
                    attrs.evolve(w, name=f"{module}.modules_to_save.weight", element_bytes=trained, trainable=True)
                )
        return out + adapters


def collect_memory(config: Any) -> dict[str, Any] | None:
    """The plugin's answer: the ``"weights"`` model when an adapter is asked for."""
    if adapter_kind(config) is None:
        return None
    compute = 2 if (config.bf16 or config.bfloat16 or config.fp16) else 4
    return {"weights": AdapterWeights(config, quantization_bits(config) or 0, compute)}
