"""What the fp8 plugin's CPU tests of delayed scaling share: the tiny Llama in bf16, the fp8 keys as the
runtime reads them (``fp8_recipe: delayed`` with its defaults, unless a test says otherwise), and a few training
steps."""

from __future__ import annotations

import types
from collections.abc import Iterable

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


def train_steps(
    model: torch.nn.Module, optimizer: torch.optim.Optimizer, batches: Iterable[torch.Tensor]
) -> list[float]:
    """One optimizer step of ``model`` on each batch of token ids (its own labels); the losses."""
    losses = []
    for ids in batches:
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(loss.item())
    return losses
