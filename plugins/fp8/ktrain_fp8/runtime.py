"""The runtime object of ``fp8: true``: the planned linear layers swapped for torchao's ``Float8Linear`` (or, under
``fp8_recipe: delayed``, for ``ktrain_fp8.delayed``'s layers, whose scale histories are saved with checkpoints).

``Float8Linear`` is a ``torch.nn.Linear`` whose forward casts its input, its weight and, in the backward,
the output's gradient to float8 with dynamic scales, and multiplies them with ``torch._scaled_mm``; the
weight stays the parameter it was (same name, dtype and gradient dtype), so the optimizer, its master
weights, checkpoints and the exported model are unchanged. The swap happens in ``ktrain_parallelize``,
before the compile plugin compiles the blocks (last in that hook) and before FSDP2 shards them (so that
``fp8_enable_fsdp_float8_all_gather`` can gather the weights in float8).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ktrain import hookimpl
from ktrain.config.report import ConfigError, Report
from ktrain_fp8.delayed import DelayedScales, convert_delayed
from ktrain_fp8.keys import MIN_CAPABILITY
from ktrain_fp8.plan import conversion_plan
from ktrain_fp8.swiglu import fuse_swiglu


def _refuse(config: Any, key: str, message: str) -> None:
    report = Report(config.source)
    report.error(key, message)
    raise ConfigError(report)


class Fp8Training:
    """Converts the planned linear layers to float8 training on each rank."""

    def __init__(self, config: Any):
        self.config = config
        self.scales: DelayedScales | None = None

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> None:
        """Stop before the model loads on a GPU without float8 tensor cores (``ktrain run`` refused it before
        launch; ``ktrain bench`` builds its run here). On a CPU torch's float8 matrix multiply is emulated:
        ``ktrain run`` refuses it, ``ktrain bench`` and tests may time or check it."""
        if run.device.type != "cuda":
            return
        capability = torch.cuda.get_device_capability(run.device)
        if capability < MIN_CAPABILITY:
            _refuse(
                self.config,
                "fp8",
                f"needs a GPU of compute capability 8.9 or later; {torch.cuda.get_device_name(run.device)} is "
                f"{capability[0]}.{capability[1]}; remove fp8",
            )

    @hookimpl
    def ktrain_parallelize(self, model: torch.nn.Module, run: Any) -> None:
        """Swap the planned layers for float8 ones in place (before compiling and sharding)."""
        self.scales = convert(model, self.config, run.is_main, run.device)

    @hookimpl
    def ktrain_collect_checkpoint_state(self, run: Any) -> dict[str, Any] | None:
        """Under ``fp8_recipe: delayed``, the layers' absolute-maximum histories and scales."""
        return {"fp8_delayed_scales": self.scales} if self.scales is not None else None


def convert(
    model: torch.nn.Module, config: Any, announce: bool = False, device: torch.device | None = None
) -> DelayedScales | None:
    """Convert ``model``'s planned linear layers to float8 training as ``config``'s fp8 keys say; under
    ``fp8_recipe: delayed`` return the layers' scales (kept on ``device``, by default the first layer's)."""
    plan = conversion_plan(model, config.fp8_recipe, config.fp8_exclude_modules, config.fp8_skip_small_layers)
    if not plan.converted:
        _refuse(
            config,
            "fp8_exclude_modules",
            f"leaves no linear layer of {type(model).__name__} to convert ({plan.describe()}); "
            "exclude fewer modules or set fp8_skip_small_layers: false",
        )
    if config.fp8_recipe == "delayed":
        device = device or model.get_submodule(plan.converted[0]).weight.device
        history, fast = config.fp8_amax_history_len, config.fp8_fast_accumulation
        scales = convert_delayed(model, plan.converted, history, device, fast)
        fused = fuse_swiglu(model) if config.fp8_fused_mlp else []
        if announce:
            print(f"fp8: {plan.describe()}; {len(fused)} SwiGLU MLPs fused (fp8_fused_mlp)", flush=True)
        return scales
    if announce:
        print(f"fp8: {plan.describe()}", flush=True)
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    settings = Float8LinearConfig.from_recipe_name(config.fp8_recipe)
    if config.fp8_enable_fsdp_float8_all_gather:
        settings = dataclasses.replace(settings, enable_fsdp_float8_all_gather=True)
    if config.fp8_fast_accumulation:
        fast = dataclasses.replace(settings.gemm_config_grad_input, use_fast_accum=True)
        settings = dataclasses.replace(settings, gemm_config_grad_input=fast, gemm_config_grad_weight=fast)
    chosen = set(plan.converted)
    convert_to_float8_training(model, module_filter_fn=lambda _, name: name in chosen, config=settings)
    return None
