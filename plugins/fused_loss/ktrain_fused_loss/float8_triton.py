"""The cross entropy of a block of logits with its gradient written in float8, in both layouts (Triton).

Two kernels. The first, one program a row, finds each row's log-sum-exp (online, in fp32) and its loss. The
second, one program a tile of rows x vocabulary, writes ``(softmax - onehot(label)) * scale`` for the tile in
float8, twice: row-major into ``grad`` and transposed into ``grad_t``, the layouts the two products of the
output layer's backward read. The logits are read twice, as by the bf16 kernel, and the two float8 copies
write as many bytes as its one bf16 gradient. Ignored rows get a zero gradient and a zero loss. The scale
is a constant, not a pass over the tensor: every element lies in (-1, 1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ktrain_fused_loss.cross_entropy_triton import row_log_sum_exp

BLOCK = 4096
ROWS, COLUMNS = 64, 128
WARPS = 8


@triton.jit
def _row_loss_kernel(logits, stride, labels, lse_out, losses, vocab, ignore_index, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    start = logits + row * stride
    label = tl.load(labels + row)
    lse = row_log_sum_exp(start, vocab, BLOCK)
    valid = label != ignore_index
    picked = tl.load(start + tl.where(valid, label, 0)).to(tl.float32)
    tl.store(lse_out + row, lse)
    tl.store(losses + row, tl.where(valid, lse - picked, 0.0))


@triton.jit
def _gradient_kernel(
    logits, stride, labels, lse, grad, grad_stride, grad_t, grad_t_stride, rows, vocab, width, ignore_index, scale,
    ROWS: tl.constexpr, COLUMNS: tl.constexpr,
):  # fmt: skip
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    c = tl.program_id(1) * COLUMNS + tl.arange(0, COLUMNS)
    r64, c64 = r.to(tl.int64), c.to(tl.int64)
    in_rows = r < rows
    in_vocab = in_rows[:, None] & (c < vocab)[None, :]
    mask = in_rows[:, None] & (c < width)[None, :]
    x = tl.load(logits + r64[:, None] * stride + c64[None, :], mask=in_vocab, other=0.0).to(tl.float32)
    label = tl.load(labels + r, mask=in_rows, other=ignore_index)
    top = tl.load(lse + r, mask=in_rows, other=0.0)
    g = tl.exp(x - top[:, None]) - tl.where(c[None, :] == label[:, None], 1.0, 0.0)
    trained = in_vocab & (label != ignore_index)[:, None]
    q = tl.where(trained, g * scale, 0.0).to(grad.dtype.element_ty)
    tl.store(grad + r64[:, None] * grad_stride + c64[None, :], q, mask=mask)
    tl.store(grad_t + c64[:, None] * grad_t_stride + r64[None, :], tl.trans(q), mask=tl.trans(mask))


def cross_entropy_float8(
    logits: torch.Tensor,
    labels: torch.Tensor,
    losses: torch.Tensor,
    grad: torch.Tensor,
    grad_t: torch.Tensor,
    scale: float,
    ignore_index: int,
) -> None:
    """Each row's loss into ``losses``; ``(softmax - onehot) * scale`` into ``grad`` and, transposed, ``grad_t``.
    ``grad`` may be wider than ``logits``: its columns past the vocabulary (padding) get zeros."""
    rows, vocab = logits.shape
    lse = torch.empty(rows, device=logits.device, dtype=torch.float32)
    _row_loss_kernel[(rows,)](
        logits, logits.stride(0), labels, lse, losses, vocab, ignore_index, BLOCK=BLOCK, num_warps=WARPS
    )
    width = grad.shape[1]
    grid = (triton.cdiv(rows, ROWS), triton.cdiv(width, COLUMNS))
    _gradient_kernel[grid](
        logits, logits.stride(0), labels, lse, grad, grad.stride(0), grad_t, grad_t.stride(0), rows, vocab, width,
        ignore_index, scale, ROWS=ROWS, COLUMNS=COLUMNS, num_warps=WARPS,
    )  # fmt: skip
