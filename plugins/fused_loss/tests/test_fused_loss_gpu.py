"""On a CUDA GPU: the Triton cross entropy kernels, bf16 and float8, write what the PyTorch versions write, and the
float8 products follow bf16 (skipped elsewhere)."""

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


@pytest.mark.gpu
def test_float8_kernels_match_pytorch() -> None:
    """The float8 loss's kernels against the PyTorch version: the losses, and the gradient in e5m2 in both layouts
    (both round to nearest; a rare element may differ by one float8 step where the exponentials differ)."""
    from ktrain_fused_loss.float8_output import E5M2, GRAD_SCALE, _cross_entropy_float8_torch
    from ktrain_fused_loss.float8_triton import cross_entropy_float8

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9 or later")
    torch.manual_seed(0)
    logits = (torch.randn(300, 50_000, device="cuda") * 4).bfloat16()
    labels = torch.randint(0, 50_000, (300,), device="cuda")
    labels[::7] = -100
    results = []
    for kernel in (cross_entropy_float8, _cross_entropy_float8_torch):
        losses = torch.empty(300, device="cuda")
        grad = torch.ones(400, 50_016, device="cuda").to(E5M2)  # 16 columns of padding
        grad_t = torch.ones(50_016, 400, device="cuda").to(E5M2)
        kernel(logits, labels, losses, grad[50:350], grad_t[:, 50:350], GRAD_SCALE, -100)
        results.append((losses, grad.float(), grad_t.float()))
    (losses, grad, grad_t), (want_losses, want, _) = results
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-5)
    assert torch.equal(grad_t, grad.t())
    assert (grad[:50] == 1).all() and (grad[350:] == 1).all() and (grad[50:350, 50_000:] == 0).all()
    differ = grad != want
    assert differ.sum() <= want.numel() // 10_000
    assert ((grad - want).abs()[differ] <= want.abs()[differ] * 0.25 + 2**-16).all()


@pytest.mark.gpu
def test_float8_products_against_bf16_on_an_output_layer() -> None:
    """The float8 loss against the bf16 fused loss on 4,090 tokens (padded to 4,096) x 2048 x a 128,256 vocabulary:
    the loss within 0.5%, the gradients within 5% (float8's rounding)."""
    from ktrain_fused_loss.float8_output import linear_cross_entropy_float8
    from ktrain_fused_loss.linear_cross_entropy import linear_cross_entropy

    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("float8 needs compute capability 8.9 or later")
    torch.manual_seed(0)
    hidden = torch.randn(4090, 2048, device="cuda", dtype=torch.bfloat16)
    weight = (torch.randn(128_256, 2048, device="cuda") * 0.02).bfloat16()
    labels = torch.randint(0, 128_256, (4090,), device="cuda")
    labels[::9] = -100
    divisor = (labels != -100).sum()
    grads = []
    for loss_of in (linear_cross_entropy, linear_cross_entropy_float8):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = loss_of(h, w, labels, divisor)
        loss.backward()
        grads.append((loss.detach().float(), h.grad.float(), w.grad.float()))
    (loss, grad_h, grad_w), (want, want_h, want_w) = grads[1], grads[0]
    assert loss.item() == pytest.approx(want.item(), rel=5e-3)
    assert ((grad_h - want_h).norm() / want_h.norm()).item() < 0.05
    assert ((grad_w - want_w).norm() / want_w.norm()).item() < 0.05
