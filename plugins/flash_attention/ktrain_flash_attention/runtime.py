"""The runtime object of ``flash_attention_4: true``: FlashAttention-4's kernels behind SDPA on each rank.

Before the model loads, the rank checks its GPU, gives SDPA's flash operators FlashAttention-4's kernels
(``ktrain_flash_attention.kernels``) and puts SDPA's flash backend first in its priority order, before cuDNN's,
so that SDPA picks it for attention without a mask; attention with a mask, which the flash backend does not
take, goes on to cuDNN's as before. Where SDPA's own choice still is not the flash backend, cuDNN's SDPA is
switched off. After loading, a model whose attention drops out is refused (FlashAttention-4 has
no dropout); a model on FlexAttention gets FlexAttention's FLASH backend (``ktrain_flash_attention.flex``).
"""

from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any

import torch
import torch.nn.attention

from ktrain import hookimpl
from ktrain.config.report import ConfigError, Report
from ktrain_flash_attention.keys import CAPABILITIES, INSTALL, OFF

KEY = "flash_attention_4"


def _refuse(config: Any, message: str) -> None:
    report = Report(config.source)
    report.error(KEY, message)
    raise ConfigError(report)


def prefer_flash(device: torch.device) -> str:
    """Put SDPA's flash backend first in its priority order (the order ``sdpa_kernel(..., set_priority=True)``
    sets), and check with SDPA's own choice on ``device`` that it is picked for causal attention without a mask;
    where it is not (a build that sets its preferred order at its first choice), switch cuDNN's SDPA off. Says
    which was done."""
    flash = int(torch.nn.attention.SDPBackend.FLASH_ATTENTION)
    probe = torch.zeros((1, 2, 128, 64), device=device, dtype=torch.bfloat16)
    for _ in range(2):  # the first choice may set the build's order: set ours again after it
        order = torch._C._get_sdp_priority_order()
        torch._C._set_sdp_priority_order([flash, *(backend for backend in order if backend != flash)])
        if torch._fused_sdp_choice(probe, probe, probe, is_causal=True) == flash:
            return "first before cuDNN's"
    torch.backends.cuda.enable_cudnn_sdp(False)
    return "cuDNN's SDPA off"


class FlashAttention4:
    """Owner of ``op:sdpa_flash``: SDPA's flash kernels are FlashAttention-4's on this rank."""

    def __init__(self, config: Any):
        self.config = config
        self.library: Any = None
        self.order = ""

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
        self.order = prefer_flash(run.device)

    @hookimpl
    def ktrain_wrap_model(self, model: torch.nn.Module, run: Any) -> None:
        """Refuse a model whose attention drops out; on FlexAttention, ask for its FLASH backend; say what runs."""
        dropout = getattr(model.config.get_text_config(), "attention_dropout", 0.0) or 0.0
        if dropout > 0:
            _refuse(
                self.config, f"FlashAttention-4 has no dropout, and the model's attention_dropout is {dropout}; {OFF}"
            )
        what = f"SDPA's flash kernels are FlashAttention-4's ({_release()}), {self.order}"
        if getattr(model.config, "_attn_implementation", None) == "flex_attention":
            from ktrain_flash_attention.flex import use_flash_backend

            use_flash_backend()
            what = f"FlexAttention runs FlashAttention-4's kernels ({_release()}, its FLASH backend)"
        if run.is_main:
            print(f"flash_attention_4: {what}", flush=True)


def _release() -> str:
    try:
        return version("flash-attn-4")
    except PackageNotFoundError:
        return "version unknown"
