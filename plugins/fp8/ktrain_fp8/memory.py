"""What float8 layers keep for backward: the plugin's answer to ``ktrain_collect_memory``. No torch here.

torchao's ``Float8Linear`` saves its bf16 input and weight for backward; compiled, inductor's partition
keeps the input's float8 cast (a byte an element) instead where the backward multiplies that same cast:
under the tensorwise recipe, whose single scale serves the weight's gradient too. The rowwise recipe scales
the input along the other axis for the weight's gradient, so it keeps the bf16 input. Of a Llama block this
saves the MLP's input (when gate and up both multiply in float8) and its product (when down does); q's
input is shared with k and v, which stay bf16 at the shapes of configs/bench, and o's input is the
attention's output, which attention keeps for its own backward. The weights, gradients and optimizer
states are the bf16 run's: the layers keep their parameters.
"""

from __future__ import annotations

from typing import Any

from ktrain.memory.shape import ModelShape
from ktrain_fp8.plan import kept_because

PROJECTIONS = {"float8_gate_up": ("gate_proj", "up_proj"), "float8_down": ("down_proj",)}
"""The memory model's names of the inputs kept in float8, and the projections that must all be converted."""


def kept_inputs(config: Any, shape: ModelShape) -> frozenset[str]:
    """The names of ``PROJECTIONS`` whose layers are converted in every block."""
    converted: dict[str, bool] = {}
    for t in shape.tensors():
        if t.kind != "linear":
            continue
        module = t.name.removesuffix(".weight")
        short = module.rsplit(".", 1)[-1]
        reason = kept_because(module, *t.shape, config.fp8_recipe, config.fp8_exclude_modules,
                              config.fp8_skip_small_layers)  # fmt: skip
        converted[short] = converted.get(short, True) and reason is None
    return frozenset(name for name, layers in PROJECTIONS.items() if all(converted.get(p) for p in layers))


def collect_memory(config: Any, model_shape: ModelShape) -> dict[str, Any] | None:
    """The ``"float8"`` inputs under ``fp8: true`` with one scale a tensor (tensorwise, delayed) in compiled blocks."""
    if not (config.fp8 and config.fp8_recipe in ("tensorwise", "delayed") and config.torch_compile):
        return None
    return {"float8": kept_inputs(config, model_shape)}
