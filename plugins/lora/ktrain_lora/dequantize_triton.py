"""A bitsandbytes 4-bit weight dequantized by one Triton kernel (imported where the weight is on a GPU).

bitsandbytes' ``dequantize_4bit`` of a weight with double quantization (``bnb_4bit_use_double_quant``, the
plugin's and Axolotl's default) runs three kernels, each behind Python dispatch: the 8-bit block scales
dequantized, their offset added, then the 4-bit values. A QLoRA step of the 8B Llama shape dequantizes about
580 weights (forward, recompute, input gradients): about 1,700 launches whose host time the GPU waits for
where a layer's products are small. Here one kernel reads the packed weight and the 8-bit scales and writes the
weight in its compute dtype. The arithmetic is bitsandbytes': a block's scale is ``code2[q] * absmax2[block //
blocksize2]`` rounded to fp32, then the offset added and rounded again (no fused multiply-add), and each
value is ``code[nibble] * scale`` in fp32, rounded to the compute dtype; a byte's high nibble is the first of
its two values. ``plugins/lora/tests/test_lora_dequantize.py`` compares the result with bitsandbytes' to the bit:
with its definition in Triton's interpreter, with its CUDA kernels on a GPU.
"""

from __future__ import annotations

from typing import Any

import torch
import triton
import triton.language as tl

BYTES = 1024
"""Packed bytes a program reads (two values each)."""


@triton.jit
def _dequantize_kernel(
    packed, code, absmax, absmax8, absmax2, code2, offset, out, n_bytes, n_values,
    BLOCKSIZE: tl.constexpr, BLOCKSIZE2: tl.constexpr, NESTED: tl.constexpr, BYTES: tl.constexpr,
):  # fmt: skip
    start = tl.program_id(0) * BYTES
    offsets = start + tl.arange(0, BYTES)
    mask = offsets < n_bytes
    byte = tl.load(packed + offsets, mask=mask, other=0).to(tl.int32)
    block = (offsets * 2) // BLOCKSIZE
    if NESTED:
        q = tl.load(absmax8 + block, mask=mask, other=0).to(tl.int32)
        scale = tl.load(code2 + q) * tl.load(absmax2 + block // BLOCKSIZE2, mask=mask, other=0.0)
        scale = scale + tl.load(offset)
    else:
        scale = tl.load(absmax + block, mask=mask, other=0.0)
    high = tl.load(code + (byte >> 4)) * scale
    low = tl.load(code + (byte & 15)) * scale
    values = tl.interleave(high, low).to(out.dtype.element_ty)
    positions = start * 2 + tl.arange(0, 2 * BYTES)
    tl.store(out + positions, values, mask=positions < n_values)


def dequantize(weight: torch.Tensor, state: Any) -> torch.Tensor:
    """The weight of packed 4-bit ``weight`` (bitsandbytes' layout, any storage dtype) and its ``QuantState``,
    in ``state.dtype`` and ``state.shape``, as ``bitsandbytes.functional.dequantize_4bit`` computes it."""
    packed = weight.data.view(torch.uint8).reshape(-1)
    out = torch.empty(state.shape, dtype=state.dtype, device=packed.device)
    nested = bool(state.nested)
    absmax = state.absmax
    second = state.state2 if nested else None
    _dequantize_kernel[(triton.cdiv(packed.numel(), BYTES),)](
        packed, state.code, absmax, absmax, second.absmax if nested else absmax,
        second.code if nested else state.code, state.offset if nested else absmax, out, packed.numel(), out.numel(),
        BLOCKSIZE=state.blocksize, BLOCKSIZE2=second.blocksize if nested else 1, NESTED=nested, BYTES=BYTES,
        enable_fp_fusion=False,
    )  # fmt: skip
    return out
