"""Cross entropy over a block of logits, its gradient written over the logits, in one Triton kernel (CUDA only).

One program a row: a first pass over the row finds its maximum and the sum of exponentials (online, in
fp32), a second writes ``(softmax - onehot(label)) / divisor`` over the logits in their own dtype. Two
reads and one write of the logits, nothing else allocated. The divisor is read from the device, so no
step waits for the host to know the number of trained tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 4096
WARPS = 8


@triton.jit
def row_log_sum_exp(start, vocab, BLOCK: tl.constexpr):
    """The log-sum-exp of the ``vocab`` logits from ``start``: one read, an online maximum and sum in fp32."""
    big = -float("inf")
    top = tl.full((), big, tl.float32)
    total = tl.zeros((), tl.float32)
    for offset in range(0, vocab, BLOCK):
        cols = offset + tl.arange(0, BLOCK)
        x = tl.load(start + cols, mask=cols < vocab, other=big).to(tl.float32)
        new_top = tl.maximum(top, tl.max(x, 0))
        total = total * tl.exp(top - new_top) + tl.sum(tl.exp(x - new_top), 0)
        top = new_top
    return top + tl.log(total)


@triton.jit
def _cross_entropy_kernel(
    logits, stride, labels, divisor_ptr, losses, vocab, ignore_index, BLOCK: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    start = logits + row * stride
    label = tl.load(labels + row)
    lse = row_log_sum_exp(start, vocab, BLOCK)
    valid = label != ignore_index
    safe = tl.where(valid, label, 0)
    picked = tl.load(start + safe).to(tl.float32)
    tl.store(losses + row, tl.where(valid, lse - picked, 0.0))
    scale = tl.where(valid, 1.0 / tl.load(divisor_ptr), 0.0)
    for offset in range(0, vocab, BLOCK):
        cols = offset + tl.arange(0, BLOCK)
        mask = cols < vocab
        x = tl.load(start + cols, mask=mask, other=0.0).to(tl.float32)
        g = (tl.exp(x - lse) - tl.where(cols == safe, 1.0, 0.0)) * scale
        tl.store(start + cols, g.to(logits.dtype.element_ty), mask=mask)


def cross_entropy_(
    logits: torch.Tensor, labels: torch.Tensor, divisor: torch.Tensor, losses: torch.Tensor, ignore_index: int
) -> None:
    """Write each row's loss into ``losses`` and the gradient of ``sum(losses) / divisor`` over ``logits``."""
    rows, vocab = logits.shape
    _cross_entropy_kernel[(rows,)](
        logits, logits.stride(0), labels, divisor, losses, vocab, ignore_index, BLOCK=BLOCK, num_warps=WARPS
    )
