"""The optimizers the kernel registers by name, and the default owner of ``optimizer``."""

from __future__ import annotations

from typing import Any

import torch

from ktrain import hookimpl


def _adam_kwargs(config: Any) -> dict[str, Any]:
    return {"lr": config.learning_rate, "betas": (config.adam_beta1, config.adam_beta2), "eps": config.adam_epsilon}


def adamw_torch(params: Any, config: Any) -> torch.optim.Optimizer:
    """``torch.optim.AdamW`` (the multi-tensor implementation)."""
    return torch.optim.AdamW(params, **_adam_kwargs(config), foreach=True)


def adamw_torch_fused(params: Any, config: Any) -> torch.optim.Optimizer:
    """``torch.optim.AdamW(fused=True)``: one kernel for the whole update (CUDA and CPU)."""
    return torch.optim.AdamW(params, **_adam_kwargs(config), fused=True)


adamw = adamw_torch


def adamw_fp32_master(params: Any, config: Any) -> torch.optim.Optimizer:
    """AdamW over fp32 master copies of bf16 weights (``bfloat16: true``): ``master_weights.MasterWeightAdamW``."""
    from ktrain.builtin.master_weights import MasterWeightAdamW

    return MasterWeightAdamW(params, **_adam_kwargs(config))


def sgd(params: Any, config: Any) -> torch.optim.Optimizer:
    """Plain SGD at ``learning_rate`` with ``weight_decay``."""
    return torch.optim.SGD(params, lr=config.learning_rate)


def adafactor(params: Any, config: Any) -> torch.optim.Optimizer:
    """``torch.optim.Adafactor`` (factored second moments: less optimizer memory)."""
    return torch.optim.Adafactor(params, lr=config.learning_rate)


class DefaultOptimizer:
    """Builds the optimizer registered under ``optimizer``."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_build_optimizer(self, params: Any, run: Any) -> torch.optim.Optimizer:
        return run.plan.optimizers.get(self.config.optimizer, "optimizer")(params, self.config)
