"""The runtime object of ``flash_attention_4: true``: FlashAttention-4's kernels behind SDPA on each rank.

Before the model loads, the rank checks its GPU, gives SDPA's flash operators FlashAttention-4's kernels
(``ktrain_flash_attention.kernels``) and switches cuDNN's SDPA off, so that SDPA picks its flash backend for
attention without a mask. After loading, a model whose attention drops out is refused (FlashAttention-4 has
no dropout).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch

from ktrain import hookimpl
from ktrain.config.report import ConfigError, Report
from ktrain_flash_attention.keys import CAPABILITIES, INSTALL, OFF

KEY = "flash_attention_4"


def _refuse(config: Any, message: str) -> None:
    report = Report(config.source)
    report.error(KEY, message)
    raise ConfigError(report)


class FlashAttention4:
    """Owner of ``op:sdpa_flash``: SDPA's flash kernels are FlashAttention-4's on this rank."""

    def __init__(self, config: Any):
        self.config = config
        self.library: Any = None

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> None:
        """Stop on a CPU or another GPU, or without flash-attn-4; else put its kernels behind SDPA."""
        if run.device.type != "cuda":
            _refuse(self.config, f"needs a GPU of compute capability 9.x or 10.x; this rank uses the CPU; {OFF}")
        major, minor = torch.cuda.get_device_capability(run.device)
        if major not in CAPABILITIES:
            name = torch.cuda.get_device_name(run.device)
            _refuse(self.config, f"needs a GPU of compute capability 9.x or 10.x; {name} is {major}.{minor}; {OFF}")
        from ktrain_flash_attention.kernels import register

        try:
            self.library = register()
        except ImportError as error:
            _refuse(self.config, f"needs flash-attn-4, which does not import here ({error}): {INSTALL}; or {OFF}")
        torch.backends.cuda.enable_cudnn_sdp(False)

    @hookimpl
    def ktrain_wrap_model(self, model: torch.nn.Module, run: Any) -> None:
        """Refuse a model whose attention drops out; say what runs."""
        dropout = getattr(model.config.get_text_config(), "attention_dropout", 0.0) or 0.0
        if dropout > 0:
            _refuse(
                self.config, f"FlashAttention-4 has no dropout, and the model's attention_dropout is {dropout}; {OFF}"
            )
        if run.is_main:
            try:
                release = version("flash-attn-4")
            except PackageNotFoundError:
                release = "version unknown"
            print(f"flash_attention_4: SDPA's flash kernels are FlashAttention-4's ({release}); cuDNN's SDPA off",
                  flush=True)  # fmt: skip
