"""Quantization-aware training on CPU: the layers swapped in place, the rounding toggled by step, a real run
whose export has the plain model's names, and the keys' errors before any rank starts."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import transformers
from safetensors import safe_open
from torchao.prototype.mx_formats.nvfp4_tensor import NVFP4Tensor, per_tensor_amax_to_scale
from torchao.quantization.qat.embedding import FakeQuantizedEmbedding
from torchao.quantization.qat.linear import FakeQuantizedLinear

from ktrain.config.plan import prepare
from ktrain.config.report import ConfigError
from ktrain.testing import dataset, ktrain, model_dir, read_metrics, write_config
from ktrain.testing.assets import TINY_LLAMA
from ktrain_qat.keys import QatConfig
from ktrain_qat.nvfp4 import NVFP4Linear
from ktrain_qat.runtime import FakeQuantizer, set_fake_quant

TINY = {**TINY_LLAMA, "vocab_size": 128, "use_cache": False}
IDS = torch.randint(0, 128, (2, 32), generator=torch.Generator().manual_seed(0))


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return transformers.AutoModelForCausalLM.from_config(transformers.LlamaConfig(**TINY))


def _loss(model: torch.nn.Module) -> float:
    with torch.no_grad():
        return model(input_ids=IDS, labels=IDS).loss.item()


def _quantizer(**keys) -> FakeQuantizer:
    return FakeQuantizer(types.SimpleNamespace(qat=QatConfig(**keys)))


@pytest.mark.parametrize(
    "keys",
    [
        {"weight_dtype": "int4", "activation_dtype": "int8", "group_size": 32, "quantize_embedding": True},
        {"weight_dtype": "mxfp4", "activation_dtype": "mxfp4", "group_size": 32},
    ],
    ids=["int8-int4", "mxfp4"],
)
def test_layers_are_fake_quantized_in_place_with_the_plain_names(keys) -> None:
    plain, model = _model(), _model()
    quantizer = _quantizer(**keys)
    quantizer.ktrain_wrap_model(model, types.SimpleNamespace(is_main=False))
    linears = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert linears and all(type(m) is not torch.nn.Linear for m in linears)  # lm_head included
    assert isinstance(model.model.embed_tokens, FakeQuantizedEmbedding) == bool(keys.get("quantize_embedding"))
    assert list(model.state_dict()) == list(plain.state_dict())
    rounded = _loss(model)
    assert rounded != _loss(plain)
    model(input_ids=IDS, labels=IDS).loss.backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())
    if keys["weight_dtype"] == "mxfp4":
        return  # torchao's mxfp4 layers always round (fake_quant_after_n_steps is refused with them)
    assert all(isinstance(m, FakeQuantizedLinear) for m in linears)
    quantizer.qat.fake_quant_after_n_steps = 3
    quantizer.ktrain_on_train_start(types.SimpleNamespace(step=0), engine=None)
    assert _loss(model) == _loss(plain)  # rounding off: the plain model's computation
    quantizer.ktrain_on_step_end(types.SimpleNamespace(step=2, is_main=False), step=2, metrics={})
    assert _loss(model) == _loss(plain)
    quantizer.ktrain_on_step_end(types.SimpleNamespace(step=3, is_main=False), step=3, metrics={})
    assert _loss(model) == rounded
    quantizer.ktrain_on_train_start(types.SimpleNamespace(step=0), engine=None)
    quantizer.ktrain_on_train_start(types.SimpleNamespace(step=5), engine=None)  # resumed past the step: on
    assert _loss(model) == rounded


def _torchao_nvfp4(x: torch.Tensor) -> torch.Tensor:
    """torchao's own NVFP4 round trip of a 2-D tensor, with the per-tensor scale of its nvfp4 recipe."""
    scale = per_tensor_amax_to_scale(x.abs().max())
    return NVFP4Tensor.to_nvfp4(x, per_tensor_scale=scale).dequantize(x.dtype)


def test_nvfp4_rounds_as_torchao_and_passes_gradients_straight_through() -> None:
    torch.manual_seed(0)
    plain = torch.nn.Linear(64, 48)
    layer = NVFP4Linear(plain, activations=True)
    x = torch.randn(2, 5, 64, requires_grad=True)
    out = layer(x)
    w, flat = _torchao_nvfp4(plain.weight.detach()), _torchao_nvfp4(x.detach().reshape(10, 64))
    assert not torch.equal(w, plain.weight)
    assert torch.equal(out, torch.nn.functional.linear(flat.view(2, 5, 64), w, plain.bias))
    grad = torch.randn_like(out)
    out.backward(grad)
    g = grad.reshape(10, 48)
    assert torch.allclose(layer.weight.grad, g.t() @ flat) and torch.allclose(x.grad, (g @ w).view(2, 5, 64))
    assert list(layer.state_dict()) == ["weight", "bias"]
    set_fake_quant([layer], False)  # fake_quant_after_n_steps: the plain layer's computation until then
    assert torch.equal(layer(x), plain(x))


@pytest.mark.parametrize(
    ("weight", "activation", "size"), [("int4", "int8", 32), ("nvfp4", "nvfp4", 16)], ids=["int8-int4", "nvfp4"]
)
def test_a_run_trains_and_exports_the_full_precision_names(tmp_path: Path, weight, activation, size) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 8)
    qat = {"weight_dtype": weight, "activation_dtype": activation, "group_size": size, "fake_quant_after_n_steps": 1}
    config = write_config(tmp_path, max_steps=2, micro_batch_size=2, qat=qat)
    done = ktrain("run", str(config))
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"qat: 15 layers fake-quantized (weights {weight}, inputs {activation})" in done.stdout
    assert "qat: fake quantization on from step 2" in done.stdout
    losses = read_metrics(tmp_path / "out")
    assert sorted(losses) == [1, 2] and all(v == v for v in losses.values())
    with safe_open(tmp_path / "out" / "final" / "model.safetensors", "pt") as f:
        names = set(f.keys())
    assert "model.layers.0.self_attn.q_proj.weight" in names and not any("quantizer" in n for n in names)


def test_pairs_and_combinations_it_does_not_train_are_refused(tmp_path: Path) -> None:
    model_dir(tmp_path)
    dataset(tmp_path, 4)
    axolotl_nvfp4 = {"weight_dtype": "nvfp4", "activation_dtype": "nvfp4", "group_size": 16}  # Axolotl's examples
    prepare(write_config(tmp_path, qat=axolotl_nvfp4))  # what ktrain check runs: no error
    cases = {
        "nvfp4 weights with activation_dtype int8 are not supported by ktrain-plugin-qat": {
            "qat": {"weight_dtype": "nvfp4", "activation_dtype": "int8", "group_size": 16}
        },
        "qat.weight_dtype: nvfp4 rounds float32 or bfloat16 weights": {
            "qat": {"weight_dtype": "nvfp4", "activation_dtype": "nvfp4"},
            "fp16": True,
        },
        "qat.group_size: nvfp4 quantizes blocks of 16": {
            "qat": {"weight_dtype": "nvfp4", "activation_dtype": "nvfp4", "group_size": 32}
        },
        "qat.group_size: mxfp4 quantizes blocks of 32": {
            "qat": {"weight_dtype": "mxfp4", "activation_dtype": "mxfp4", "group_size": 16}
        },
        "qat.fake_quant_after_n_steps: is not supported with mxfp4 weights": {
            "qat": {"weight_dtype": "mxfp4", "activation_dtype": "mxfp4", "fake_quant_after_n_steps": 5}
        },
        "qat: does not combine with adapter": {"qat": {"weight_dtype": "int4"}, "adapter": "lora"},
    }
    for message, keys in cases.items():
        with pytest.raises(ConfigError) as e:
            prepare(write_config(tmp_path, **keys))
        assert message in str(e.value), str(e.value)
