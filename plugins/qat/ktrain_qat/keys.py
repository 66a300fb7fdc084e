"""The config key of ktrain-plugin-qat: Axolotl's ``qat`` mapping (no torch here)."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key

SUPPORTED = {
    ("int4", None): None,
    ("int4", "int8"): None,
    ("mxfp4", "mxfp4"): 32,
    ("nvfp4", None): 16,
    ("nvfp4", "nvfp4"): 16,
}
"""(weight_dtype, activation_dtype) pairs this plugin fake-quantizes, with the group size each requires (None:
any). Axolotl's float8 pairs run torch's scaled-matmul kernels that are not tested here."""


@attrs.define(kw_only=True)
class QatConfig:
    """Keys of ``qat``: what the linear layers' weights and inputs are rounded to in training."""

    weight_dtype: str = key("int8", "the weights' fake-quantized type: int4, mxfp4 or nvfp4")
    activation_dtype: str | None = key(
        None, "the layers' inputs' fake-quantized type: int8 (with int4 weights), mxfp4, nvfp4"
    )
    group_size: int | None = key(32, "elements per quantization group of a weight row (mxfp4: 32, nvfp4: 16)")
    quantize_embedding: bool = key(False, "fake-quantize the input embeddings' weights too (weights only)")
    fake_quant_after_n_steps: int | None = key(
        None, "train this many steps without fake quantization first (a resume past it starts with it on)"
    )


@attrs.define(kw_only=True)
class QatKeys:
    """Quantization-aware training: the model learns weights that survive quantization after training."""

    qat: QatConfig | None = key(
        None,
        "fake-quantize the linear layers' weights (and inputs) in training, as torchao's QAT; the exported "
        "weights stay full precision, to quantize with torchao afterwards",
    )
