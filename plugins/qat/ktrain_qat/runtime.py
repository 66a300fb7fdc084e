"""The runtime object of ``qat``: torchao's quantization-aware training on the loaded model.

``ktrain_wrap_model`` swaps each ``nn.Linear`` (the output layer included) for torchao's
``FakeQuantizedLinear``, and with ``quantize_embedding`` each ``nn.Embedding`` for ``FakeQuantizedEmbedding``,
as Axolotl's ``qat`` does: in forward the weights (and the layers' inputs) are rounded to the chosen type and
back, and gradients pass the rounding unchanged (straight-through), so training finds weights that lose
little when quantized afterwards. Both classes keep the parameters of the module they replace, so the state
dict, checkpoints and the exported model have the plain model's names and full-precision weights; quantize
the export with torchao (``quantize_`` with the matching config) to serve it.

nvfp4 weights (and inputs) are rounded by ``ktrain_qat.nvfp4``'s layers, which multiply in the model's own
precision on any device (torchao's NVFP4 layers need a Blackwell GPU's FP4 matmul).

``fake_quant_after_n_steps`` (int4 and nvfp4 weights; torchao's mxfp4 layers always round): the rounding is off for
that many optimizer steps, then on; a resumed run sets it from the step it resumes at.
"""

from __future__ import annotations

from typing import Any

import torch
from torchao.quantization import quantize_
from torchao.quantization.qat import QATConfig
from torchao.quantization.qat.embedding import FakeQuantizedEmbedding
from torchao.quantization.qat.fake_quantize_config import Int4WeightFakeQuantizeConfig, IntxFakeQuantizeConfig
from torchao.quantization.qat.linear import FakeQuantizedLinear

from ktrain import hookimpl
from ktrain_qat.nvfp4 import NVFP4Linear, swap_linears


def _fake_quantize_configs(qat: Any) -> tuple[Any, Any]:
    """torchao's (weight, activation) fake-quantize configs of a supported ``qat`` (``keys.SUPPORTED``), built
    as Axolotl builds them."""
    if qat.weight_dtype == "mxfp4":
        from torchao.prototype.qat import MXFakeQuantizeConfig

        mx = MXFakeQuantizeConfig(dtype=torch.float4_e2m1fn_x2, block_size=qat.group_size or 32)
        return mx, mx
    group_size = qat.group_size if qat.group_size is not None else 128
    if qat.activation_dtype == "int8":
        weight = Int4WeightFakeQuantizeConfig(group_size=group_size, activation_dtype=torch.bfloat16)
        return weight, IntxFakeQuantizeConfig(dtype=torch.int8, granularity="per_token", is_symmetric=False)
    return Int4WeightFakeQuantizeConfig(group_size=group_size), None


def fake_quantized(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's fake-quantized linear and embedding layers (torchao's int and mx classes, nvfp4's)."""
    from torchao.prototype.qat import MXFakeQuantizedLinear

    kinds = (FakeQuantizedLinear, FakeQuantizedEmbedding, MXFakeQuantizedLinear, NVFP4Linear)
    return [m for m in model.modules() if isinstance(m, kinds)]


def set_fake_quant(modules: list[torch.nn.Module], enabled: bool) -> None:
    """Turn the rounding of ``modules`` (their weights' and inputs') on or off."""
    for module in modules:
        for name in ("weight_fake_quantizer", "activation_fake_quantizer"):
            quantizer = getattr(module, name, None)
            if quantizer is not None and hasattr(quantizer, "enabled"):
                quantizer.enabled = enabled


class FakeQuantizer:
    """Swaps the linear layers for fake-quantized ones after loading, and turns the rounding on at the step
    ``fake_quant_after_n_steps`` names."""

    def __init__(self, config: Any):
        self.qat = config.qat
        self.modules: list[torch.nn.Module] = []

    @hookimpl
    def ktrain_wrap_model(self, model: torch.nn.Module, run: Any) -> None:
        """Fake-quantize the linear layers (and the embeddings with ``quantize_embedding``) in place."""
        if self.qat.weight_dtype == "nvfp4":
            swap_linears(model, activations=self.qat.activation_dtype == "nvfp4")
        else:
            self._torchao_prepare(model)
        self.modules = fake_quantized(model)
        if run.is_main:
            print(f"qat: {len(self.modules)} layers fake-quantized ({self._types()})", flush=True)

    def _torchao_prepare(self, model: torch.nn.Module) -> None:
        """torchao's fake-quantized layers in place of the linear layers (and embeddings), as Axolotl's."""
        weight, activation = _fake_quantize_configs(self.qat)
        quantize_(model, QATConfig(weight_config=weight, activation_config=activation, step="prepare"))
        if self.qat.quantize_embedding:
            quantize_(
                model,
                QATConfig(weight_config=weight, step="prepare"),
                filter_fn=lambda module, _: isinstance(module, torch.nn.Embedding),
            )

    def _types(self) -> str:
        return f"weights {self.qat.weight_dtype}, inputs {self.qat.activation_dtype or 'full precision'}"

    @hookimpl
    def ktrain_on_train_start(self, run: Any, engine: Any) -> None:
        """Rounding off until ``fake_quant_after_n_steps`` (from the step a resumed run starts at)."""
        after = self.qat.fake_quant_after_n_steps
        if after is not None:
            set_fake_quant(self.modules, run.step >= after)

    @hookimpl
    def ktrain_on_step_end(self, run: Any, step: int, metrics: dict[str, float]) -> None:
        """Rounding on once ``fake_quant_after_n_steps`` optimizer steps are done."""
        if self.qat.fake_quant_after_n_steps == step:
            set_fake_quant(self.modules, True)
            if run.is_main:
                print(f"qat: fake quantization on from step {step + 1}", flush=True)
