"""On a CUDA GPU: the Triton cross entropy writes what the PyTorch version writes (skipped elsewhere)."""

from __future__ import annotations

import pytest
import torch

from ktrain_fused_loss.linear_cross_entropy import _cross_entropy_torch


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_triton_cross_entropy_matches_pytorch(dtype: torch.dtype) -> None:
    from ktrain_fused_loss.cross_entropy_triton import cross_entropy_

    torch.manual_seed(0)
    logits = (torch.randn(300, 50_000, device="cuda") * 4).to(dtype)  # the vocabulary over several blocks
    labels = torch.randint(0, 50_000, (300,), device="cuda")
    labels[::7] = -100
    divisor = torch.tensor(123.0, device="cuda")
    want, got = logits.clone(), logits.clone()
    want_losses, got_losses = torch.empty(300, device="cuda"), torch.empty(300, device="cuda")
    _cross_entropy_torch(want, labels, divisor, want_losses, -100)
    cross_entropy_(got, labels, divisor, got_losses, -100)
    torch.testing.assert_close(got_losses, want_losses, rtol=1e-5, atol=1e-5)
    assert (got_losses[::7] == 0).all()
    ulp = 2**-7 if dtype == torch.bfloat16 else 1e-5  # the gradient rounded once to the dtype: at most a unit apart
    torch.testing.assert_close(got.float(), want.float(), rtol=ulp, atol=1e-7)
