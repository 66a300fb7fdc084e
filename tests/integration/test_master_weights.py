"""``optimizer: adamw_fp32_master``: bf16 weights and gradients, fp32 masters and Adam states in the optimizer.

A run with it (learning, fp32 state in the checkpoint, exact resume) is in tests/integration/test_training.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from ktrain.builtin.master_weights import MasterWeightAdamW
from ktrain.testing import dataset, ktrain, model_dir, write_config


def _pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    weight = torch.randn(64, 48).bfloat16()
    return weight, torch.randn(64, 48).bfloat16()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_update_is_adamw_on_the_masters_rounded_into_the_weights(device: str) -> None:
    """Each step is ``torch.optim.AdamW(fused=True)`` on fp32 copies fed the same gradients, and the bf16
    weight is the fp32 result rounded. On a CPU (``torch._fused_adamw_`` in chunks; a small chunk size makes
    a step span several) to the bit; on a GPU (the Triton kernel) to float32 rounding. On steps 2 and 3 a
    clipping coefficient is handed in (``scale_gradients``): the reference's fp32 gradients are multiplied
    by it."""
    weights = [torch.nn.Parameter(_pair(s)[0].to(device)) for s in range(3)]
    fp32 = [torch.nn.Parameter(w.detach().float()) for w in weights]
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    ours = MasterWeightAdamW([{"params": weights, "weight_decay": 0.1}], **kwargs)
    ours.CHUNK = 64 * 48
    reference = torch.optim.AdamW(fp32, fused=True, **kwargs)
    for step in range(4):
        scale = torch.tensor(0.25 + 0.125 * step, device=device) if step >= 2 else None
        for i, (w, f) in enumerate(zip(weights, fp32, strict=True)):
            w.grad = _pair(10 * step + i)[1].to(device)
            f.grad = w.grad.float() if scale is None else w.grad.float() * scale
        if scale is not None:
            ours.scale_gradients(scale)
        ours.step()
        reference.step()
    for w, f in zip(weights, fp32, strict=True):
        master = ours.state[w]["master"]
        if device == "cpu":
            assert torch.equal(master, f.detach())
        else:
            torch.testing.assert_close(master, f.detach(), rtol=1e-5, atol=1e-6)
        assert w.dtype == torch.bfloat16 and torch.equal(w.detach(), master.bfloat16())


def test_the_triton_kernel_in_triton_s_interpreter_matches_fused_adamw() -> None:
    """The GPU kernel run by Triton's CPU interpreter (``TRITON_INTERPRET=1``, in a fresh process): masters
    and moments within float32 rounding of fused AdamW over 4 steps, two of them with scaled gradients.
    (The interpreter truncates when it rounds to bf16, so the bf16 weight is checked on the GPU only, above.)"""
    pytest.importorskip("triton")
    script = """
import torch
from ktrain.builtin import master_weights_triton
torch.manual_seed(0)
n = 5000
weight, grads = torch.randn(n).bfloat16(), [torch.randn(n).bfloat16() for _ in range(4)]
master, exp_avg, exp_avg_sq, step = weight.float(), torch.zeros(n), torch.zeros(n), torch.zeros(())
group = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
reference = torch.nn.Parameter(weight.float())
adamw = torch.optim.AdamW([reference], fused=True, **group)
for i, g in enumerate(grads):
    step += 1
    scale = torch.tensor(0.5) if i % 2 else None
    master_weights_triton.update(weight, master, g, exp_avg, exp_avg_sq, step, scale, group)
    reference.grad = g.float() if scale is None else g.float() * scale
    adamw.step()
state = adamw.state[reference]
torch.testing.assert_close(master, reference.detach(), rtol=1e-5, atol=1e-6)
torch.testing.assert_close(exp_avg, state["exp_avg"], rtol=1e-5, atol=1e-7)
torch.testing.assert_close(exp_avg_sq, state["exp_avg_sq"], rtol=1e-5, atol=1e-9)
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


def test_the_engine_s_clipping_reaches_the_update() -> None:
    """``Engine.step`` with ``max_grad_norm`` hands the clipping coefficient to ``scale_gradients``: the step
    equals clipping fp32 copies of the gradients by the same norm, then fused AdamW, to the bit (CPU)."""
    from ktrain.engine import Engine

    weights = [torch.nn.Parameter(_pair(s)[0]) for s in range(3)]
    model = torch.nn.ParameterList(weights)
    fp32 = [torch.nn.Parameter(w.detach().float()) for w in weights]
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.0}
    ours = MasterWeightAdamW(weights, **kwargs)
    engine = Engine(model, model, ours, torch.optim.lr_scheduler.ConstantLR(ours, factor=1.0), max_grad_norm=0.5)
    reference = torch.optim.AdamW(fp32, fused=True, **kwargs)
    for w in weights:
        w.grad = _pair(7)[1] * 4  # a norm far above 0.5: clipped
    total = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(w.grad) for w in weights]))
    coefficient = torch.clamp(0.5 / (total + 1e-6), max=1.0)
    assert coefficient < 0.1
    for w, f in zip(weights, fp32, strict=True):
        f.grad = w.grad.float() * coefficient
    norm = engine.step()
    reference.step()
    assert float(norm) == pytest.approx(float(total))
    for w, f in zip(weights, fp32, strict=True):
        assert torch.equal(ours.state[w]["master"], f.detach())


def test_updates_below_bf16_rounding_add_up_in_the_masters() -> None:
    """A tiny learning rate: plain AdamW on bf16 weights never moves them; the masters move them."""
    start = torch.full((256,), 1.0, dtype=torch.bfloat16)
    plain, mastered = torch.nn.Parameter(start.clone()), torch.nn.Parameter(start.clone())
    kwargs = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8}
    optimizers = [
        torch.optim.AdamW([plain], fused=True, weight_decay=0.0, **kwargs),
        MasterWeightAdamW([mastered], **kwargs),
    ]
    for _ in range(100):
        plain.grad = torch.ones_like(plain)
        mastered.grad = torch.ones_like(mastered)
        for optimizer in optimizers:
            optimizer.step()
    assert torch.equal(plain.detach(), start)  # each step's 1e-4 is below bf16's step of 2**-7 near 1
    assert (mastered.detach() < start).all()  # 100 steps of 1e-4 add up to about 1e-2 in the masters


def test_without_bfloat16_the_check_names_the_key(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 40)
    config = write_config(tmp_path, optimizer="adamw_fp32_master")
    checked = ktrain("check", str(config))
    assert checked.returncode == 2
    assert "optimizer" in checked.stderr + checked.stdout and "bfloat16: true" in checked.stderr + checked.stdout
