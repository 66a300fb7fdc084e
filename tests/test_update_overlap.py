"""``optimizer_overlap``: adamw_fp32_master's update on a second CUDA stream, beside the next forward.

The GPU tests delay the side stream (``torch.cuda._sleep`` before each update) so that a forward that did
not wait for its weights would read old ones; the losses must still equal, to the bit, a run whose update
runs in the step. The same delay with the blocks' waits removed gives other losses: the check can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from ktrain.builtin.master_weights import MasterWeightAdamW
from ktrain.builtin.update_overlap import forward_parts
from ktrain.testing.assets import TINY_LLAMA
from tests.kit import dataset, ktrain, model_dir, records, write_config


def _llama(**overrides: object) -> transformers.LlamaForCausalLM:
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(**{**TINY_LLAMA, **overrides}))


def test_the_parts_follow_the_forward() -> None:
    """Embedding and final norm first, then one part a block, the output embedding last; tied, it is first."""
    model = _llama(num_hidden_layers=3)
    names = {id(p): n for n, p in model.named_parameters()}
    parts = [[names[id(p)] for p in part] for part in forward_parts(model, list(model.parameters()))]
    assert parts[0] == ["model.embed_tokens.weight", "model.norm.weight"]
    assert [{n.split(".")[2] for n in part} for part in parts[1:4]] == [{"0"}, {"1"}, {"2"}]
    assert parts[4] == ["lm_head.weight"]
    tied = _llama(num_hidden_layers=2, tie_word_embeddings=True)
    parts = forward_parts(tied, list(tied.parameters()))
    assert tied.lm_head.weight is tied.model.embed_tokens.weight and parts[0][0] is tied.lm_head.weight
    assert parts[-1] == []


def test_without_cuda_the_update_runs_in_the_step(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 16)
    config = write_config(tmp_path, bfloat16=True, optimizer="adamw_fp32_master", optimizer_overlap=True, max_steps=2)
    done = ktrain("run", str(config), env={"CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert "optimizer_overlap: no CUDA device, so the update runs within the step" in done.stdout


def _train(overlap: bool, waits: bool = True, steps: int = 4) -> tuple[list[float], dict[str, torch.Tensor]]:
    """Losses and final weights of ``steps`` steps of a tiny bf16 Llama; the side stream sleeps before each update."""
    model = _llama(num_hidden_layers=4).to("cuda", torch.bfloat16)
    optimizer = MasterWeightAdamW(model.parameters(), lr=1e-2, betas=(0.9, 0.95), eps=1e-8)
    if overlap:
        optimizer.overlap_with(model, torch.device("cuda"))
        update = optimizer._update

        def late_update(*args: object) -> None:
            torch.cuda._sleep(50_000_000)  # tens of ms on the side stream: longer than a forward of this model
            update(*args)

        optimizer._update = late_update
        if not waits:  # keep the wait of the first part and the end of the forward, drop the blocks'
            for handle in optimizer.overlap.handles[1:-2]:
                handle.remove()
    generator = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        ids = torch.randint(0, TINY_LLAMA["vocab_size"], (2, 32), generator=generator).cuda()
        loss = model(input_ids=ids, labels=ids).loss
        losses.append(loss.float())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    optimizer.wait_for_update()
    return [float(x) for x in losses], {k: v.clone() for k, v in model.state_dict().items()}


@pytest.mark.gpu
def test_a_late_update_is_waited_for_block_by_block() -> None:
    losses, weights = _train(overlap=False)
    overlapped_losses, overlapped_weights = _train(overlap=True)
    assert overlapped_losses == losses
    assert all(torch.equal(weights[k], overlapped_weights[k]) for k in weights)
    unwaited, _ = _train(overlap=True, waits=False)
    assert unwaited[0] == losses[0] and unwaited[1:] != losses[1:]  # the blocks read weights not yet updated


@pytest.mark.gpu
def test_a_run_with_overlap_matches_one_without_and_checkpoints_the_same(tmp_path: Path) -> None:
    """Through ``ktrain run`` on the GPU: the same losses, checkpoint and final weights, to the bit."""
    model_dir(tmp_path)
    dataset(tmp_path, 64)
    outs = {}
    for name, overlap in (("plain", False), ("overlap", True)):
        config = write_config(
            tmp_path,
            f"{name}.yaml",
            bfloat16=True,
            optimizer="adamw_fp32_master",
            optimizer_overlap=overlap,
            max_steps=6,
            save_steps=3,
            output_dir=str(tmp_path / name),
        )
        done = ktrain("run", str(config))
        assert done.returncode == 0, done.stderr
        outs[name] = tmp_path / name
    assert records(outs["plain"]) == records(outs["overlap"])
    for file in ("checkpoints/step-00000003/model.safetensors", "final/model.safetensors"):
        plain, overlapped = (load_file(outs[name] / file) for name in ("plain", "overlap"))
        assert plain.keys() == overlapped.keys() and all(torch.equal(plain[k], overlapped[k]) for k in plain)
    states = [torch.load(outs[n] / "checkpoints/step-00000003/optimizer.pt", weights_only=True) for n in outs]
    assert all(torch.equal(a[k], b[k]) for a, b in zip(*(s["state"].values() for s in states), strict=True) for k in a)
