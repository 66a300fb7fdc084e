"""The SwiGLU MLP's pointwise parts with their float8 casts, each in one pass (Triton; GPU only).

The forward reads the gate and up projections' outputs once and writes the hidden activation ``silu(gate) * up``
in e4m3 at the scale given, and its absolute maximum by atomic maxima. Compiled inductor code reads both twice:
in the profile of the 1.5B shape's step, one kernel takes the maximum and another casts.

The backward: from the gradient of the MLP's hidden activation and the gate and up projections' outputs, each
program takes a tile of tokens x intermediate features, reads the three once and writes, all in float8 with the
scales given (delayed scaling: known before the pass):

- the gate's and the up projection's output gradients, each row-major and transposed (the layouts of the two
  products of each layer's backward), in e5m2;
- the hidden activation ``silu(gate) * up``, transposed, in e4m3 (the down projection's weight gradient);
- the two gradients' absolute maxima, folded in by atomic maxima (for the scales that follow).

Compiled inductor code does the same work in several passes, and writes fp32 intermediates between them. The
transposed copies are ``rows`` padded to a multiple of 16 long, zero past the tokens (float8 products reduce over
multiples of 16).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from ktrain_fp8.delayed import E4M3, E5M2, padded_rows

ROWS, COLUMNS = 64, 128
WARPS = 8
"""The backward's tile (tokens x features) and warps a program."""
BLOCK, BLOCK_WARPS = 4096, 8
"""The forward's elements and warps a program."""


@triton.jit
def _swiglu_forward_kernel(gate, up, n, scale, hidden, amax, LIMIT: tl.constexpr, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < n
    a = tl.load(gate + offsets, mask=inside, other=0.0).to(tl.float32)
    b = tl.load(up + offsets, mask=inside, other=0.0).to(tl.float32)
    h = a * tl.sigmoid(a) * b
    tl.store(hidden + offsets, tl.clamp(h * tl.load(scale), -LIMIT, LIMIT).to(hidden.dtype.element_ty), mask=inside)
    tl.atomic_max(amax, tl.max(tl.abs(h), axis=0))


@triton.jit
def _swiglu_backward_kernel(
    grad_h, gate, up, rows, width, padded, scales, grad_gate, grad_gate_t, grad_up, grad_up_t, hidden_t, amax,
    GRAD_LIMIT: tl.constexpr, HIDDEN_LIMIT: tl.constexpr, ROWS: tl.constexpr, COLUMNS: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    r64, c64 = r.to(tl.int64), c.to(tl.int64)
    tokens = (r < rows)[:, None] & (c < width)[None, :]
    written = (r < padded)[:, None] & (c < width)[None, :]
    offsets = r64[:, None] * width + c64[None, :]
    g = tl.load(grad_h + offsets, mask=tokens, other=0.0).to(tl.float32)
    a = tl.load(gate + offsets, mask=tokens, other=0.0).to(tl.float32)
    b = tl.load(up + offsets, mask=tokens, other=0.0).to(tl.float32)
    sigmoid = tl.sigmoid(a)
    silu = a * sigmoid
    d_gate = g * b * sigmoid * (1.0 + a * (1.0 - sigmoid))
    d_up = g * silu
    q_gate = tl.clamp(d_gate * tl.load(scales), -GRAD_LIMIT, GRAD_LIMIT).to(grad_gate.dtype.element_ty)
    q_up = tl.clamp(d_up * tl.load(scales + 1), -GRAD_LIMIT, GRAD_LIMIT).to(grad_up.dtype.element_ty)
    q_hidden = tl.clamp(silu * b * tl.load(scales + 2), -HIDDEN_LIMIT, HIDDEN_LIMIT).to(hidden_t.dtype.element_ty)
    transposed = c64[:, None] * padded + r64[None, :]
    tl.store(grad_gate + offsets, q_gate, mask=tokens)
    tl.store(grad_up + offsets, q_up, mask=tokens)
    # the transposed copies are converted from the transposed fp32 tile: transposing the e5m2 tile that is also
    # stored row-major gave wrong values in a quarter of the elements on an H100 (torch 2.11's Triton); e4m3's did not
    q_gate_t = tl.clamp(tl.trans(d_gate) * tl.load(scales), -GRAD_LIMIT, GRAD_LIMIT).to(grad_gate.dtype.element_ty)
    q_up_t = tl.clamp(tl.trans(d_up) * tl.load(scales + 1), -GRAD_LIMIT, GRAD_LIMIT).to(grad_up.dtype.element_ty)
    tl.store(grad_gate_t + transposed, q_gate_t, mask=tl.trans(written))
    tl.store(grad_up_t + transposed, q_up_t, mask=tl.trans(written))
    tl.store(hidden_t + transposed, tl.trans(q_hidden), mask=tl.trans(written))
    tl.atomic_max(amax, tl.max(tl.max(tl.abs(d_gate), axis=1), axis=0))
    tl.atomic_max(amax + 1, tl.max(tl.max(tl.abs(d_up), axis=1), axis=0))


@triton_op("ktrain_fp8::swiglu_forward_float8", mutates_args=())
def swiglu_forward_float8(
    gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``ktrain_fp8.swiglu.swiglu_forward_float8_reference``'s outputs from one pass over contiguous ``gate`` and
    ``up``; ``scale``: the hidden activation's (fp32, one element)."""
    hidden = gate.new_empty(gate.shape, dtype=E4M3)
    amax = gate.new_zeros((), dtype=torch.float32)
    n = gate.numel()
    wrap_triton(_swiglu_forward_kernel)[(triton.cdiv(n, BLOCK),)](
        gate, up, n, scale, hidden, amax, LIMIT=torch.finfo(E4M3).max, BLOCK=BLOCK, num_warps=BLOCK_WARPS
    )
    return hidden, amax


@triton_op("ktrain_fp8::swiglu_backward_float8", mutates_args=())
def swiglu_backward_float8(
    grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """``ktrain_fp8.swiglu.swiglu_backward_float8_reference``'s outputs from one pass over contiguous
    ``grad_h``, ``gate`` and ``up`` (tokens x features); ``scales``: the gate's gradient's, the up projection's
    gradient's and the hidden activation's (fp32, 3)."""
    rows, width = gate.shape
    padded = padded_rows(rows)
    grad_gate, grad_up = (gate.new_empty((rows, width), dtype=E5M2) for _ in range(2))
    grad_gate_t, grad_up_t = (gate.new_empty((width, padded), dtype=E5M2) for _ in range(2))
    hidden_t = gate.new_empty((width, padded), dtype=E4M3)
    amax = gate.new_zeros(2, dtype=torch.float32)
    grid = (triton.cdiv(padded, ROWS), triton.cdiv(width, COLUMNS))
    wrap_triton(_swiglu_backward_kernel)[grid](
        grad_h, gate, up, rows, width, padded, scales, grad_gate, grad_gate_t, grad_up, grad_up_t, hidden_t, amax,
        GRAD_LIMIT=torch.finfo(E5M2).max, HIDDEN_LIMIT=torch.finfo(E4M3).max, ROWS=ROWS, COLUMNS=COLUMNS,
        num_warps=WARPS,
    )  # fmt: skip
    return grad_gate, grad_gate_t, grad_up, grad_up_t, hidden_t, amax
