"""``optimizer: adamw_fp32_master``: bf16 weights and gradients, fp32 masters and Adam states in the optimizer."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from ktrain.builtin.master_weights import MasterWeightAdamW
from tests.kit import dataset, ktrain, model_dir, records, write_config


def _pair(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    weight = torch.randn(64, 48).bfloat16()
    return weight, torch.randn(64, 48).bfloat16()


def test_the_update_is_fused_adamw_on_the_masters_rounded_into_the_weights() -> None:
    """Each step equals ``torch.optim.AdamW(fused=True)`` on fp32 copies fed the same gradients; the bf16
    weight is the fp32 result rounded. A small chunk size makes a step span several chunks."""
    weights = [torch.nn.Parameter(_pair(s)[0]) for s in range(3)]
    fp32 = [torch.nn.Parameter(w.detach().float()) for w in weights]
    kwargs = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}
    ours = MasterWeightAdamW([{"params": weights, "weight_decay": 0.1}], **kwargs)
    ours.CHUNK = 64 * 48
    reference = torch.optim.AdamW(fp32, fused=True, **kwargs)
    for step in range(4):
        for i, (w, f) in enumerate(zip(weights, fp32, strict=True)):
            w.grad = _pair(10 * step + i)[1]
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


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path, attention_dropout=0.1)  # dropout: resume must restore the RNG to be exact
    dataset(tmp_path, 400)
    return tmp_path


def test_a_run_learns_keeps_fp32_masters_and_resumes_exactly(root: Path) -> None:
    """bf16 weights in the checkpoint and export, fp32 masters and moments in the optimizer state; a run
    resumed from step 4 ends with the same losses and bit-identical weights as one that ran through."""
    config = write_config(root, bfloat16=True, optimizer="adamw_fp32_master", max_steps=8, save_steps=4)
    whole = ktrain("run", str(config))
    assert whole.returncode == 0, whole.stderr
    losses = records(root / "out")
    assert losses[8] < 0.8 * losses[1], losses
    checkpoint = root / "out" / "checkpoints" / "step-00000004"
    assert {t.dtype for t in load_file(checkpoint / "model.safetensors").values()} == {torch.bfloat16}
    states = torch.load(checkpoint / "optimizer.pt", weights_only=True)["state"].values()
    assert {s[k].dtype for s in states for k in ("master", "exp_avg", "exp_avg_sq")} == {torch.float32}
    one_go = root / "one_go"
    shutil.copytree(root / "out", one_go)
    shutil.rmtree(root / "out" / "checkpoints" / "step-00000008")
    shutil.rmtree(root / "out" / "final")
    lines = (root / "out" / "metrics.jsonl").read_text().splitlines()
    (root / "out" / "metrics.jsonl").write_text("\n".join(lines[:4]) + "\n")
    resumed = ktrain("run", str(config), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert records(root / "out") == records(one_go)
    final, again = (load_file(d / "final" / "model.safetensors") for d in (root / "out", one_go))
    assert final.keys() == again.keys() and all(torch.equal(final[k], again[k]) for k in final)


def test_without_bfloat16_the_check_names_the_key(root: Path) -> None:
    config = write_config(root, optimizer="adamw_fp32_master")
    checked = ktrain("check", str(config))
    assert checked.returncode == 2
    assert "optimizer" in checked.stderr + checked.stdout and "bfloat16: true" in checked.stderr + checked.stdout
