"""The fused loss with float8 products on CPU, where torch emulates ``torch._scaled_mm``: its loss and gradients
against fp32's, its Triton kernels in Triton's interpreter against the PyTorch version and compiled for a Hopper
GPU ahead of time, and the keys' checks. On a GPU, ``test_fused_loss_gpu`` runs the kernels compiled."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ktrain.testing import launch_problems, model_dir, write_config
from ktrain_fused_loss.float8_output import GRAD_SCALE, linear_cross_entropy_float8
from ktrain_fused_loss.linear_cross_entropy import linear_cross_entropy


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got - want).norm() / want.norm()).item()


@pytest.mark.parametrize("frozen", [False, True])
def test_loss_and_gradients_are_fp32_s_within_float8_rounding(frozen: bool) -> None:
    """Against the fp32 fused loss: the loss within 1e-3, the gradients within 4% (e5m2 keeps 2 bits of
    mantissa, e4m3 3); a frozen weight gets no gradient. 300 tokens and a vocabulary of 500 are padded to
    multiples of 16. A product fed the wrong layout or size would fail on a GPU, and here ``_mm`` refuses it."""
    torch.manual_seed(0)
    hidden = torch.randn(300, 64, requires_grad=True)
    weight = (torch.randn(500, 64) * 0.1).requires_grad_(not frozen)
    labels = torch.randint(0, 500, (300,))
    labels[::5] = -100
    divisor = torch.tensor(240.0)
    loss = linear_cross_entropy_float8(hidden, weight, labels, divisor)
    (loss * 3).backward()
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_(not frozen)
    want = linear_cross_entropy(h, w, labels, divisor)
    (want * 3).backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-3)
    assert loss.item() != want.item()
    assert _relative(hidden.grad, h.grad) < 0.04
    if frozen:
        assert weight.grad is None
    else:
        assert _relative(weight.grad, w.grad) < 0.04


def test_the_logits_are_computed_a_chunk_of_rows_at_a_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows split into chunks (as for a long batch on a GPU) give the same loss and gradients as one chunk."""
    import ktrain_fused_loss.float8_output as float8_output

    torch.manual_seed(0)
    hidden, weight = torch.randn(50, 32), torch.randn(40, 32) * 0.1
    labels = torch.randint(0, 40, (50,))
    results = []
    for chunk_logits in (1 << 28, 48 * 16):  # one chunk; chunks of 16 rows (the 50 padded to 64)
        monkeypatch.setattr(float8_output, "CHUNK_LOGITS", chunk_logits)
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        loss = linear_cross_entropy_float8(h, w, labels, torch.tensor(50.0))
        loss.backward()
        results.append((loss.detach(), h.grad, w.grad))
    for got, want in zip(results[1], results[0], strict=True):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


INTERPRETED = """
import torch

from ktrain.testing.triton_interpreter import converted_as_interpreted
from ktrain_fused_loss.float8_output import E5M2, GRAD_SCALE
from ktrain_fused_loss.float8_triton import cross_entropy_float8

torch.manual_seed(0)
logits = (torch.randn(70, 300) * 4).bfloat16()
labels = torch.randint(0, 300, (70,))
labels[::7] = -100
losses = torch.empty(70)
# rows 10-79 written, 4 columns of padding past the vocabulary among them: the rest keeps its ones
grad, grad_t = torch.ones(100, 304).to(E5M2), torch.ones(304, 100).to(E5M2)
cross_entropy_float8(logits, labels, losses, grad[10:80], grad_t[:, 10:80], GRAD_SCALE, -100)
full = logits.float()
lse = full.logsumexp(-1)
valid = labels != -100
want = (full - lse[:, None]).exp() - torch.nn.functional.one_hot(labels.clamp(min=0), 300)
want = (want * (valid * GRAD_SCALE)[:, None]).contiguous()
converted = torch.nn.functional.pad(converted_as_interpreted(want, E5M2).float(), (0, 4))
want_losses = torch.where(valid, lse - full.gather(1, labels.clamp(min=0)[:, None])[:, 0], 0.0)
torch.save([losses, grad.float(), grad_t.float(), want_losses, converted], "results.pt")
"""


def test_the_triton_kernels_write_what_pytorch_computes_in_triton_s_interpreter(tmp_path: Path) -> None:
    """The two kernels run by Triton's interpreter on the CPU (``TRITON_INTERPRET=1``, set before Triton
    compiles anything, so in a process of its own): the losses of PyTorch's fp32, and its gradient times
    ``GRAD_SCALE`` converted to e5m2 the interpreter's way (which is not torch's: it rounds toward zero, by up to
    half the value), in both layouts, zeros in the padding past the vocabulary, in the rows asked for only. A
    few elements may differ where the two exponentials round differently at a float8 boundary."""
    pytest.importorskip("triton")
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    losses, grad, grad_t, want_losses, want = torch.load(tmp_path / "results.pt", weights_only=True)
    torch.testing.assert_close(losses, want_losses, rtol=1e-5, atol=1e-5)
    assert (losses[::7] == 0).all() and (grad[10:80][::7] == 0).all()
    assert torch.equal(grad_t, grad.t())
    assert (grad[:10] == 1).all() and (grad[80:] == 1).all()
    assert (grad[10:80, 300:] == 0).all()
    assert (grad[10:80] != want).sum() <= want.numel() // 1000
    assert grad.abs().max() <= GRAD_SCALE and (grad[10:80] < 0).sum() == (want < 0).sum() == 60  # one a row


def test_the_triton_kernels_compile_for_hopper_without_a_gpu() -> None:
    """Triton's ahead-of-time compiler builds both kernels for compute capability 9.0 on this machine, no GPU
    needed, and the gradient's conversion to e5m2 is the hardware's round-to-nearest (what the interpreter does
    not show)."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ktrain_fused_loss.float8_triton import BLOCK, COLUMNS, ROWS, WARPS, _gradient_kernel, _row_loss_kernel

    hopper = GPUTarget("cuda", 90, 32)
    rows = {"logits": "*bf16", "stride": "i64", "labels": "*i64", "lse_out": "*fp32", "losses": "*fp32"}
    rows |= {"vocab": "i32", "ignore_index": "i32", "BLOCK": "constexpr"}
    tiles = {"logits": "*bf16", "stride": "i64", "labels": "*i64", "lse": "*fp32", "grad": "*fp8e5"}
    tiles |= {"grad_stride": "i64", "grad_t": "*fp8e5", "grad_t_stride": "i64", "rows": "i32", "vocab": "i32"}
    tiles |= {"width": "i32", "ignore_index": "i32", "scale": "fp32", "ROWS": "constexpr", "COLUMNS": "constexpr"}
    options = {"num_warps": WARPS}
    source = ASTSource(fn=_row_loss_kernel, signature=rows, constexprs={"BLOCK": BLOCK})
    assert triton.compile(source, target=hopper, options=options).asm["cubin"]
    source = ASTSource(fn=_gradient_kernel, signature=tiles, constexprs={"ROWS": ROWS, "COLUMNS": COLUMNS})
    ptx = triton.compile(source, target=hopper, options=options).asm["ptx"]
    assert "cvt.rn.satfinite.e5m2x2.f32" in ptx


def test_the_keys_checks(tmp_path: Path) -> None:
    """Without the fused loss, in chunks, or on a GPU without float8 tensor cores: an error naming the key; on
    a CPU a warning (torch emulates the products)."""
    model_dir(tmp_path)
    alone = write_config(tmp_path, "a.yaml", fused_linear_cross_entropy_fp8=True)
    chunked = write_config(
        tmp_path, "b.yaml", fused_linear_cross_entropy=True, fused_linear_cross_entropy_chunks=2,
        fused_linear_cross_entropy_fp8=True,
    )  # fmt: skip
    problems = {"alone": launch_problems(alone, "cpu"), "chunks": launch_problems(chunked, "cpu")}
    good = write_config(tmp_path, "c.yaml", fused_linear_cross_entropy=True, fused_linear_cross_entropy_fp8=True)
    problems["ampere"] = launch_problems(good, "cuda", (8, 0))
    problems["cpu"] = launch_problems(good, "cpu")
    problems["hopper"] = launch_problems(good, "cuda", (9, 0))
    assert (
        "fused_linear_cross_entropy_fp8: runs inside fused_linear_cross_entropy; set that key too"
        in (problems["alone"])
    )
    assert (
        "fused_linear_cross_entropy_fp8: holds the logits' gradient in float8 until the backward; set "
        in (problems["chunks"])
    )
    assert "compute capability 8.9 or later (float8 tensor cores); this one is 8.0" in problems["ampere"]
    assert "warning: fused_linear_cross_entropy_fp8: on a CPU torch emulates the float8 products" in problems["cpu"]
    assert "fused_linear_cross_entropy_fp8" not in problems["hopper"]
