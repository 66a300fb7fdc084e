"""The fused output layer and loss on CPU: its gradients against PyTorch's, training as Hugging Face's loss
trains, and the keys' errors. The Triton kernel is checked on a GPU (``test_fused_loss_gpu``)."""

from __future__ import annotations

import copy
import types
from pathlib import Path

import pytest
import torch

from ktrain.testing import dataset, ktrain, model_dir, write_config
from ktrain.testing import read_metrics as records
from ktrain_fused_loss.linear_cross_entropy import linear_cross_entropy


@pytest.mark.parametrize("chunks", [1, 3])
def test_loss_and_gradients_match_pytorch(chunks: int) -> None:
    torch.manual_seed(0)
    hidden = torch.randn(50, 16, requires_grad=True)
    weight = torch.randn(40, 16, requires_grad=True)
    labels = torch.randint(0, 40, (50,))
    labels[::6] = -100
    divisor = torch.tensor(37.0)
    loss = linear_cross_entropy(hidden, weight, labels, divisor, chunks)
    (loss * 3).backward()  # an incoming gradient other than 1 scales both gradients
    h, w = hidden.detach().clone().requires_grad_(), weight.detach().clone().requires_grad_()
    want = torch.nn.functional.cross_entropy(h @ w.t(), labels, reduction="sum") / 37
    (want * 3).backward()
    assert loss.item() == pytest.approx(want.item(), rel=1e-6)
    torch.testing.assert_close(hidden.grad, h.grad, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(weight.grad, w.grad, rtol=1e-5, atol=1e-7)


def test_a_frozen_output_layer_gets_no_gradient_and_chunks_give_the_same_hidden_gradient() -> None:
    """A frozen output layer (an adapter's run): in one chunk or several, the same loss and hidden states'
    gradient, and none for the weight."""
    torch.manual_seed(0)
    weight = torch.randn(10, 4)
    results = []
    for chunks in (1, 2, 3):
        hidden = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)).requires_grad_()
        loss = linear_cross_entropy(hidden, weight, torch.arange(8), torch.tensor(8.0), chunks)
        loss.backward()
        assert weight.grad is None and hidden.grad is not None
        results.append((loss.detach(), hidden.grad))
    for loss, grad in results[1:]:
        torch.testing.assert_close(loss, results[0][0], rtol=1e-6, atol=0)
        torch.testing.assert_close(grad, results[0][1], rtol=1e-6, atol=1e-8)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path)
    dataset(tmp_path, 40)
    return tmp_path


def test_training_matches_the_plain_loss(root: Path) -> None:
    """fp32 on CPU, with accumulation: the fused loss trains as Hugging Face's loss does, in 1 or 3 chunks; with
    float8 products (emulated by torch on a CPU) it follows the same losses within the rounding of float8."""
    runs, outputs = {}, {}
    for name, keys in (
        ("plain", {}),
        ("fused", {"fused_linear_cross_entropy": True}),
        ("chunked", {"fused_linear_cross_entropy": True, "fused_linear_cross_entropy_chunks": 3}),
        ("float8", {"fused_linear_cross_entropy": True, "fused_linear_cross_entropy_fp8": True}),
    ):
        config = write_config(root, f"{name}.yaml", output_dir=str(root / name), gradient_accumulation_steps=2, **keys)
        done = ktrain("run", str(config))
        assert done.returncode == 0, done.stderr[-3000:]
        assert ("fused_loss: LlamaForCausalLM output layer and loss fused" in done.stdout) == (name != "plain")
        runs[name], outputs[name] = records(root / name), done.stdout
    assert "output layer and loss fused, 3 chunk(s)" in outputs["chunked"]
    assert "output layer and loss fused, float8 products" in outputs["float8"]
    assert len(runs["plain"]) == 6
    for name in ("fused", "chunked"):
        for step, loss in runs["plain"].items():
            assert runs[name][step] == pytest.approx(loss, rel=1e-5), (name, step)
    for step, loss in runs["plain"].items():
        assert runs["float8"][step] == pytest.approx(loss, rel=3e-3), step
        assert runs["float8"][step] != loss, step  # the products did run in float8


def test_fsdp2_on_two_ranks_trains_as_the_plain_loss(root: Path) -> None:
    """FSDP2 gathers the output layer's weight for the root's forward, which the fused forward reads."""
    pytest.importorskip("ktrain_fsdp")
    runs = {}
    for name, fused in (("plain", False), ("fused", True)):
        config = write_config(
            root, f"{name}.yaml", output_dir=str(root / name), fsdp_version=2, micro_batch_size=2,
            gradient_accumulation_steps=2, max_steps=3, fused_linear_cross_entropy=fused,
        )  # fmt: skip
        done = ktrain("run", str(config), "--nproc-per-node", "2")
        assert done.returncode == 0, done.stderr[-3000:]
        assert ("output layer and loss fused" in done.stdout) == fused
        runs[name] = records(root / name, "grad_norm")
    assert len(runs["plain"]) == 3
    for step, norm in runs["plain"].items():
        assert runs["fused"][step] == pytest.approx(norm, rel=1e-5), step


def test_a_lora_adapter_wraps_the_fused_forward() -> None:
    """peft wraps the patched model and calls the fused forward (no logits come back): same loss and adapter
    gradients as Hugging Face's loss, and no gradient for the frozen output layer."""
    peft = pytest.importorskip("peft")
    import transformers

    from ktrain_fused_loss.runtime import FusedLoss

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=8,
    )  # fmt: skip
    base = transformers.AutoModelForCausalLM.from_config(config)
    patched = copy.deepcopy(base)
    keys = types.SimpleNamespace(
        fused_linear_cross_entropy_chunks=2, fused_linear_cross_entropy_fp8=False, source="run.yaml"
    )
    FusedLoss(keys).ktrain_wrap_model(patched, types.SimpleNamespace(is_main=False))
    lora = peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"])
    ids = torch.randint(0, 100, (2, 12))
    outs, grads = [], []
    for model in (base, patched):
        torch.manual_seed(1)
        wrapped = peft.get_peft_model(model, lora)
        out = wrapped(input_ids=ids, labels=ids)
        out.loss.backward()
        outs.append(out)
        grads.append({n: p.grad for n, p in wrapped.named_parameters() if p.requires_grad})
    assert outs[0].logits is not None and outs[1].logits is None  # the second ran the fused forward
    assert outs[1].loss.item() == pytest.approx(outs[0].loss.item(), rel=1e-6)
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=1e-4, atol=1e-7)
    assert patched.get_output_embeddings().weight.grad is None


def test_bad_keys_stop_before_training(root: Path) -> None:
    config = write_config(root, fused_linear_cross_entropy_chunks=4)
    done = ktrain("check", str(config))
    assert done.returncode == 2
    assert "fused_linear_cross_entropy_chunks: sizes fused_linear_cross_entropy's chunks; set that key too" in (
        done.stderr
    )
    config = write_config(root, fused_linear_cross_entropy=True, fused_linear_cross_entropy_chunks=0)
    assert "must be a whole number of at least 1" in ktrain("check", str(config)).stderr
    config = write_config(root, fused_linear_cross_entropy=True, tensor_parallel_size=2, fsdp_version=2)
    done = ktrain("check", str(config), "--world-size", "2")
    assert done.returncode == 2
    assert "fused_linear_cross_entropy: is not supported with tensor_parallel_size other than 1 yet" in done.stderr


def test_liger_fused_loss_and_this_one_conflict(root: Path) -> None:
    pytest.importorskip("ktrain_liger")
    config = write_config(root, fused_linear_cross_entropy=True, liger_fused_linear_cross_entropy=True)
    done = ktrain("check", str(config))
    assert done.returncode == 2
    assert "op:fused_linear_cross_entropy" in done.stderr


def test_an_architecture_with_scaled_logits_is_refused(root: Path) -> None:
    """Gemma soft-caps its logits: the plain fused loss would train another model, so the run stops first."""
    import transformers

    gemma = root / "gemma"
    transformers.Gemma2Config(
        vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=1, head_dim=16,
    ).save_pretrained(gemma)  # fmt: skip
    config = write_config(root, base_model_config=str(gemma), fused_linear_cross_entropy=True)
    done = ktrain("run", str(config))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "fused_linear_cross_entropy: supports model_type llama, mistral, qwen2, qwen3, phi3, not 'gemma2'" in (
        done.stderr
    )
    assert not (root / "out" / "metrics.jsonl").exists()
