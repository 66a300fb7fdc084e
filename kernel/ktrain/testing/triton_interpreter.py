"""Float8 as Triton's interpreter converts to it, for tests that run a plugin's Triton kernels on a CPU.

Under ``TRITON_INTERPRET=1`` a kernel's conversion to float8 rounds toward zero, where torch and the GPU round to
nearest, so a test compares a kernel's float8 output with its expected values converted here, by a Triton kernel
too. Import it only in a process that set ``TRITON_INTERPRET=1`` before Triton compiled anything.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit
def _convert(source, target, n, BLOCK: tl.constexpr):
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(source + offsets, mask=offsets < n)
    tl.store(target + offsets, x.to(target.dtype.element_ty), mask=offsets < n)


def converted_as_interpreted(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``values`` (fp32) converted to the float8 ``dtype`` as a kernel run by the interpreter converts them."""
    values = values.float().contiguous()
    out = torch.empty(values.shape, dtype=dtype)
    _convert[(triton.cdiv(values.numel(), BLOCK),)](values, out, values.numel(), BLOCK=BLOCK)
    return out
