"""The fused LoRA forward (``ktrain_lora.fused_forward``) against peft's own, on the tiny Llama on CPU.

One model of each kind (plain LoRA on an fp32 base, QLoRA on a 4-bit base) is built per module; each test
computes the loss and the adapter's gradients with peft's forward, installs the fused one on the same
model, and computes them again. A ``TorchFunctionMode`` counts the ``addmm`` calls, which only the fused
path makes: the fallbacks must make none. A 4-bit layer's fused path computes its base last; under
activation checkpointing the recompute then skips the last 4-bit product of each block.
"""

from __future__ import annotations

import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import peft
import pytest
import torch
import transformers
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

from ktrain.testing import model_dir
from ktrain_lora.adapter import attach
from ktrain_lora.fused_forward import install

LAYERS = 2 * 7  # adapted linear layers of the tiny Llama: q, k, v, o, gate, up, down in 2 blocks


class _Addmm(TorchFunctionMode):
    """Counts the ``torch.addmm`` and ``Tensor.addmm_`` calls made at the Python level."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls += func in (torch.addmm, torch.Tensor.addmm_)
        return func(*args, **(kwargs or {}))


def _keys(adapter: str, **overrides: object) -> types.SimpleNamespace:
    keys = {
        "adapter": adapter,
        "qlora": False,
        "load_in_4bit": False,
        "load_in_8bit": False,
        "lora_model_dir": None,
        "lora_r": 8,
        "lora_alpha": 16,
        "lora_dropout": 0.0,
        "lora_target_modules": None,
        "lora_target_parameters": None,
        "lora_target_linear": True,
        "lora_modules_to_save": None,
        "peft_use_dora": False,
        "peft_use_rslora": False,
        "lora_fused_forward": False,
    }
    return types.SimpleNamespace(**{**keys, **overrides})


def _model(root: Path, adapter: str, device: str = "cpu", **keys: object) -> peft.PeftModel:
    """The tiny Llama with an adapter (peft's forward), its ``lora_B`` drawn away from zero as after training;
    a 4-bit base computes in fp32 on the CPU, in bf16 on a GPU."""
    config = transformers.AutoConfig.from_pretrained(root / "model")
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    if adapter == "qlora":
        compute = torch.float32 if device == "cpu" else torch.bfloat16
        quantization = transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=compute)
        base = type(base).from_pretrained(
            None, config=config, state_dict=base.state_dict(), quantization_config=quantization, device_map=device
        )
    else:
        base = base.to(device)
    model = attach(base, _keys(adapter, **keys)).train()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(len(name))) * 0.02)
    return model


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("fused")
    model_dir(root)
    return root


IDS = torch.randint(0, 100, (2, 16), generator=torch.Generator().manual_seed(1))


def _step(model: torch.nn.Module, autocast: bool = False) -> tuple[float, dict[str, torch.Tensor], int]:
    """Loss, the adapter's gradients, and how many ``addmm`` calls the forward and backward made."""
    model.zero_grad(set_to_none=True)
    with _Addmm() as counter, torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(input_ids=IDS, labels=IDS).loss
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return loss.item(), grads, counter.calls


class _Dequantized(TorchDispatchMode):
    """Counts the 4-bit weights dequantized: bitsandbytes' ``gemm_4bit`` (a dequantization and a product) and
    ``dequantize_4bit`` calls."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        self.calls += func.overloadpacket in (torch.ops.bitsandbytes.gemm_4bit, torch.ops.bitsandbytes.dequantize_4bit)
        return func(*args, **(kwargs or {}))


class _Sums(TorchDispatchMode):
    """Counts the additions whose result has ``numel`` elements."""

    def __init__(self, numel: int) -> None:
        super().__init__()
        self.numel, self.calls = numel, 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        self.calls += func.overloadpacket in (torch.ops.aten.add, torch.ops.aten.add_) and out.numel() == self.numel
        return out


@contextmanager
def _peft_forward(model: torch.nn.Module) -> Iterator[None]:
    """peft's forward for the duration (the fused forward is an attribute of each layer)."""
    layers = [m for m in model.modules() if "forward" in vars(m)]
    for layer in layers:
        del layer.forward
    yield
    install(model)


@pytest.mark.parametrize("adapter", ["lora", "qlora"])
def test_the_fused_forward_gives_peft_losses_and_gradients(tiny: Path, adapter: str) -> None:
    model = _model(tiny, adapter)
    loss, grads, calls = _step(model)
    assert calls == 0
    assert install(model) == LAYERS
    fused_loss, fused_grads, calls = _step(model)
    assert calls == LAYERS  # one addmm a layer (in place into the update for a 4-bit one)
    assert fused_loss == pytest.approx(loss, rel=1e-6)
    assert fused_grads.keys() == grads.keys()
    for name, grad in grads.items():  # fp32: only the rounding of the scale and the sum differ
        torch.testing.assert_close(fused_grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    # Under bf16 autocast the input is not cast to fp32 and back; the fused sum rounds once instead of three times.
    fused_loss, fused_grads, calls = _step(model, autocast=True)
    assert calls == LAYERS
    with _peft_forward(model):
        loss, grads, _ = _step(model, autocast=True)
    assert fused_loss == pytest.approx(loss, rel=1e-2)
    for name, grad in grads.items():
        assert torch.nn.functional.cosine_similarity(fused_grads[name].flatten(), grad.flatten(), dim=0) > 0.99, name


@pytest.mark.parametrize("adapter", ["lora", "qlora"])
def test_a_layers_input_gradient_is_summed_in_its_product(tiny: Path, adapter: str) -> None:
    """peft's backward adds the base's and the adapter's gradients of a layer's input in a pass of its own; the
    fused layer adds the adapter's into the base's in ``addmm_``'s epilogue: no addition over the input's size,
    the same gradients."""
    layer = _model(tiny, adapter).base_model.model.model.layers[0].mlp.down_proj
    x = torch.randn(2, 16, layer.in_features, requires_grad=True, generator=torch.Generator().manual_seed(2))
    sums, grads = [], []
    for fused in (False, True):
        if fused:
            install(layer)
        x.grad = None
        out = layer(x)
        with _Sums(x.numel()) as counter:
            out.backward(torch.ones_like(out))
        sums.append(counter.calls)
        grads.append(x.grad.clone())
    assert sums == [1, 0]
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-6)


def test_a_recomputed_block_skips_its_last_4bit_product(tiny: Path) -> None:
    """Under activation checkpointing each block's forward runs again in the backward, until the tensors it
    saved are back. The fused 4-bit forward computes its base last, and the 4-bit product saves nothing, so
    the recompute stops before the last layer's (``down_proj``) dequantization and product. The backward
    dequantizes every weight once for the input's gradient (14) and, in the recompute, 12 where peft's
    forward dequantizes 14. The gradients are peft's."""
    model = _model(tiny, "qlora")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()

    def dequantized() -> tuple[int, int, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        with _Dequantized() as forward:
            loss = model(input_ids=IDS, labels=IDS).loss
        with _Dequantized() as backward:
            loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
        return forward.calls, backward.calls, grads

    peft_forward, peft_backward, peft_grads = dequantized()
    install(model)
    forward, backward, grads = dequantized()
    assert (peft_forward, peft_backward) == (LAYERS, 2 * LAYERS)
    assert (forward, backward) == (LAYERS, 2 * LAYERS - 2)
    for name, grad in peft_grads.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)
    # Without autograd (generation) bitsandbytes' own product runs: no addmm_ into the update, the same logits.
    with _Addmm() as counter:
        logits = model(input_ids=IDS).logits.detach()
        with torch.no_grad():
            torch.testing.assert_close(model(input_ids=IDS).logits, logits, rtol=1e-5, atol=1e-6)
    assert counter.calls == LAYERS


@pytest.mark.gpu
def test_the_fused_4bit_forward_on_a_gpu_gives_peft_losses_and_gradients(tiny: Path) -> None:
    """bitsandbytes' CUDA kernels, bf16 autocast, activation checkpointing: the fused forward's loss and
    gradients are peft's (rounded differently: the sum in the product's epilogue), and the recompute
    dequantizes 12 of the 14 weights."""
    model = _model(tiny, "qlora", device="cuda")
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.enable_input_require_grads()
    ids = IDS.cuda()

    def step() -> tuple[float, dict[str, torch.Tensor], int, int]:
        model.zero_grad(set_to_none=True)
        with _Dequantized() as forward, torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        with _Dequantized() as backward:
            loss.backward()
        grads = {n: p.grad.float().cpu() for n, p in model.named_parameters() if p.requires_grad}
        return loss.item(), grads, forward.calls, backward.calls

    loss, grads, forward, backward = step()
    assert (forward, backward) == (LAYERS, 2 * LAYERS)
    install(model)
    fused_loss, fused_grads, forward, backward = step()
    assert (forward, backward) == (LAYERS, 2 * LAYERS - 2)
    assert fused_loss == pytest.approx(loss, rel=1e-2)
    for name, grad in grads.items():
        assert torch.nn.functional.cosine_similarity(fused_grads[name].flatten(), grad.flatten(), dim=0) > 0.99, name


def test_peft_forward_runs_where_the_fused_one_cannot(tiny: Path) -> None:
    """Adapters disabled (a preference reference), merged weights, two active adapters, dropout, DoRA."""
    model = _model(tiny, "lora", lora_fused_forward=True)
    torch.manual_seed(0)
    base = transformers.AutoModelForCausalLM.from_config(model.config, dtype=torch.float32)
    with torch.no_grad(), _Addmm() as counter:
        fused = model(input_ids=IDS).logits
        assert counter.calls == LAYERS
        with model.disable_adapter():
            torch.testing.assert_close(model(input_ids=IDS).logits, base(input_ids=IDS).logits, rtol=0, atol=0)
        model.merge_adapter()
        torch.testing.assert_close(model(input_ids=IDS).logits, fused, rtol=1e-4, atol=1e-5)
        model.unmerge_adapter()
        assert counter.calls == LAYERS
        model.add_adapter("other", peft.LoraConfig(r=4, target_modules=["q_proj"]))
        model.base_model.set_adapter(["default", "other"])
        model(input_ids=IDS)
        assert counter.calls == 2 * LAYERS - 2  # the layers without "other" still fuse; the two q_proj do not
    for keys in ({"lora_dropout": 0.1}, {"peft_use_dora": True}):
        with torch.no_grad(), _Addmm() as counter:
            _model(tiny, "lora", lora_fused_forward=True, **keys)(input_ids=IDS)
        assert counter.calls == 0, keys


def test_a_base_with_a_bias_gives_peft_outputs_and_gradients() -> None:
    """A base with a bias (Qwen2's q, k and v projections): the fused node adds it in the base's product; fp32
    outputs and gradients are peft's."""
    torch.manual_seed(0)
    base = torch.nn.Sequential()
    base.add_module("q_proj", torch.nn.Linear(32, 48, bias=True))
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj"]))
    layer = model.base_model.model.q_proj
    with torch.no_grad():
        layer.lora_B["default"].weight.normal_(std=0.1)
    x = torch.randn(3, 5, 32, requires_grad=True)
    results = []
    for fused in (False, True):
        if fused:
            assert install(model) == 1
        x.grad = None
        model.zero_grad(set_to_none=True)
        with _Addmm() as counter:
            out = model(x)
        out.pow(2).sum().backward()
        weights = (layer.lora_A["default"].weight.grad, layer.lora_B["default"].weight.grad)
        results.append((counter.calls, out.detach(), x.grad.clone(), *weights))
    assert (results[0][0], results[1][0]) == (0, 2)  # the bias's addmm and the update's addmm_
    for got, expected in zip(results[1][1:], results[0][1:], strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
