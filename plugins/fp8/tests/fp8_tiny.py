"""What the fp8 plugin's CPU tests of delayed scaling share: the tiny Llama in bf16 and the fp8 keys as the
runtime reads them (``fp8_recipe: delayed`` with its defaults, unless a test says otherwise)."""

from __future__ import annotations

import types

import torch
import transformers

from ktrain.testing.assets import TINY_LLAMA

DELAYED = {
    "fp8_recipe": "delayed",
    "fp8_amax_history_len": 2,
    "fp8_fast_accumulation": False,
    "fp8_fused_mlp": True,
    "fp8_exclude_modules": ["lm_head"],
    "fp8_skip_small_layers": False,
    "fp8_enable_fsdp_float8_all_gather": False,
    "source": "run.yaml",
}


def delayed_keys(**keys) -> types.SimpleNamespace:
    """The fp8 keys of a run with delayed scaling: every block linear layer converted, histories of 2."""
    return types.SimpleNamespace(**{**DELAYED, **keys})


def tiny_llama(seed: int = 0) -> transformers.PreTrainedModel:
    """The tiny Llama of ``ktrain.testing.assets`` (2 blocks) in bf16, its weights drawn from ``seed``."""
    torch.manual_seed(seed)
    config = transformers.LlamaConfig(**TINY_LLAMA, use_cache=False)
    return transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
