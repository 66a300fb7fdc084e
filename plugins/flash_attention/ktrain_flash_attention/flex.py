"""FlexAttention on FlashAttention-4's kernels: PyTorch's FlexAttention has a backend, ``BACKEND: FLASH`` in its
``kernel_options``, that compiles the block mask's ``mask_mod`` into FlashAttention-4's CuTe DSL kernels
(forward and backward) in place of its Triton ones. transformers hands ``kernel_options`` from the model's
keyword arguments to its FlexAttention function; ``use_flash_backend()`` registers, in transformers' attention
functions, that function asking for the FLASH backend unless a call names a backend itself. The block masks
(DPO's shared rows, packed rows) stay as they are built.

It asks only for training's forward passes (gradients on: evaluation and generation, whose masks and shapes the
FLASH backend was not checked with, keep the Triton kernels) inside a compiled region (ktrain-plugin-compile's
compiled blocks), where the log-sum-exp that transformers' function also returns, and the layer drops, stays
inside the graph. Called eagerly, transformers compiles FlexAttention alone, with the log-sum-exp as an output of
its own; its compiled backward then takes a gradient of it, which the FLASH backward refuses ("does not support
differentiating through logsumexp"), so an uncompiled block keeps FlexAttention's Triton kernels.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch

FLASH = {"BACKEND": "FLASH"}


def flash_backend(attend: Callable[..., Any]) -> Callable[..., Any]:
    """transformers' attention function ``attend`` (``flex_attention``), asking FlexAttention for its FLASH
    backend where the call is being compiled with gradients on and its ``kernel_options`` name no backend."""

    @functools.wraps(attend)
    def on_flash(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() and torch.is_grad_enabled():
            kwargs["kernel_options"] = {**FLASH, **(kwargs.get("kernel_options") or {})}
        return attend(module, query, key, value, attention_mask, **kwargs)

    on_flash.flash_backend = True  # type: ignore[attr-defined]
    return on_flash


def use_flash_backend() -> None:
    """Make transformers' ``flex_attention`` attention function ask for the FLASH backend (once a process)."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    current = ALL_ATTENTION_FUNCTIONS["flex_attention"]
    if not getattr(current, "flash_backend", False):
        AttentionInterface.register("flex_attention", flash_backend(current))
