"""``optimizer: adamw_fp32_master``: bf16 weights and gradients, fp32 masters and Adam states in the optimizer.

A run with it (learning, fp32 state in the checkpoint, exact resume) is in tests/test_training.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from ktrain.builtin.master_weights import MasterWeightAdamW
from tests.kit import dataset, ktrain, model_dir, write_config


def _pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    weight = torch.randn(64, 48).bfloat16()
    return weight, torch.randn(64, 48).bfloat16()


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_update_is_fused_adamw_on_the_masters_rounded_into_the_weights(device: str) -> None:
    """Each step equals ``torch.optim.AdamW(fused=True)`` on fp32 copies fed the same gradients; the bf16
    weight is the fp32 result rounded. A small chunk size makes a step span several chunks."""
    weights = [torch.nn.Parameter(_pair(s)[0].to(device)) for s in range(3)]
    fp32 = [torch.nn.Parameter(w.detach().float()) for w in weights]
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    ours = MasterWeightAdamW([{"params": weights, "weight_decay": 0.1}], **kwargs)
    ours.CHUNK = 64 * 48
    reference = torch.optim.AdamW(fp32, fused=True, **kwargs)
    for step in range(4):
        for i, (w, f) in enumerate(zip(weights, fp32, strict=True)):
            w.grad = _pair(10 * step + i)[1].to(device)
            f.grad = w.grad.float()
        ours.step()
        reference.step()
    for w, f in zip(weights, fp32, strict=True):
        assert torch.equal(ours.state[w]["master"], f.detach())
        assert w.dtype == torch.bfloat16 and torch.equal(w.detach(), f.detach().bfloat16())


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
