"""The GPU update of ``adamw_fp32_master`` in one Triton kernel a weight (imported on CUDA only).

One pass reads the bf16 gradient and the fp32 master and moments and writes the master, the moments and
the bf16 weight: 28 bytes a parameter, where casting the gradient, ``torch._fused_adamw_`` and copying
the master back into the weight move 40 through three kernels. It multiplies each gradient by the
clipping coefficient as it reads it, where clipping would take a pass of 4 bytes a parameter. The
arithmetic is AdamW's as ``torch.optim.AdamW(fused=True)`` does it (decoupled decay, bias corrections
from the step count, which the kernel reads from the device so no step waits on the host); results
agree with it to float32 rounding, not to the bit (tests/integration/test_master_weights.py).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 2048


@triton.jit
def _adamw_master_kernel(
    weight, master, grad, exp_avg, exp_avg_sq, step_ptr, scale_ptr, n, lr, beta1, beta2, eps, decay,
    SCALED: tl.constexpr, BLOCK: tl.constexpr,
):  # fmt: skip
    offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offsets < n
    step = tl.load(step_ptr)
    g = tl.load(grad + offsets, mask=mask).to(tl.float32)
    if SCALED:
        g = g * tl.load(scale_ptr)
    p = tl.load(master + offsets, mask=mask)
    m = tl.load(exp_avg + offsets, mask=mask)
    v = tl.load(exp_avg_sq + offsets, mask=mask)
    p = p * (1.0 - lr * decay)
    m = m + (1.0 - beta1) * (g - m)
    v = beta2 * v + (1.0 - beta2) * g * g
    correction1 = 1.0 - tl.exp(step * tl.log(beta1))
    correction2 = 1.0 - tl.exp(step * tl.log(beta2))
    p = p - (lr / correction1) * m / (tl.sqrt(v) / tl.sqrt(correction2) + eps)
    tl.store(master + offsets, p, mask=mask)
    tl.store(exp_avg + offsets, m, mask=mask)
    tl.store(exp_avg_sq + offsets, v, mask=mask)
    tl.store(weight + offsets, p.to(weight.dtype.element_ty), mask=mask)


def update(
    weight: torch.Tensor,
    master: torch.Tensor,
    grad: torch.Tensor,
    exp_avg: torch.Tensor,
    exp_avg_sq: torch.Tensor,
    step: torch.Tensor,
    scale: torch.Tensor | None,
    group: dict,
) -> None:
    """One AdamW step of ``master`` (and its moments) from ``grad`` times ``scale`` (when given), rounded into
    ``weight``; all contiguous, ``step`` already counting this step."""
    beta1, beta2 = group["betas"]
    n = weight.numel()
    _adamw_master_kernel[(triton.cdiv(n, BLOCK),)](
        weight, master, grad, exp_avg, exp_avg_sq, step, step if scale is None else scale, n,
        float(group["lr"]), beta1, beta2, group["eps"], group["weight_decay"], SCALED=scale is not None, BLOCK=BLOCK,
    )  # fmt: skip
