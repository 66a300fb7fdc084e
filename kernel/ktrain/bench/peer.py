"""The peer of ``ktrain bench --peer hf``: the training step a user writes with plain Hugging Face and PyTorch.

The same model (``AutoModelForCausalLM`` from the config's ``base_model``/``base_model_config``; random
weights under ``random_init_weights``), SDPA attention, the same rows as the ktrain side, a mean loss
per micro-batch divided by the accumulation steps, gradient clipping at ``max_grad_norm`` (the norm is
computed when it is unset, as the kernel does), and ``torch.optim.AdamW`` (``fused=True`` on a GPU)
with decay on matrices only. No ktrain hook or plugin takes part. Variants:

- ``mixed`` (default): fp32 weights and autocast to the run's compute dtype: what the Hugging Face
  Trainer does with ``bf16: true`` (under ``fp16`` without a loss scaler: the speed is what is compared);
- ``bf16``: the weights themselves in bf16, no autocast (small updates are lost).

The loss stays on the device until the timed steps end, so the loop never waits for the GPU, as in the
Hugging Face Trainer.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
import transformers

from ktrain.bench.timing import Timed, Timeline, run_steps
from ktrain.data.batches import collate, row_tokens
from ktrain.engine import param_groups
from ktrain.run.metrics import flops_per_token

VARIANTS = {
    "mixed": "fp32 weights + {dtype} autocast",
    "bf16": "bf16 weights, no autocast",
}


def build_model(config: Any, device: torch.device, variant: str) -> torch.nn.Module:
    """The config's model as plain transformers builds it, on ``device``, in training mode."""
    auto = getattr(transformers, config.model_type or "AutoModelForCausalLM")
    kwargs = {"attn_implementation": "sdpa", "dtype": torch.float32, "trust_remote_code": config.trust_remote_code}
    if config.random_init_weights:
        source = config.base_model_config or config.base_model
        model_config = transformers.AutoConfig.from_pretrained(source, trust_remote_code=config.trust_remote_code)
        model = auto.from_config(model_config, **kwargs)
    else:
        model = auto.from_pretrained(config.base_model, **kwargs)
    model.config.use_cache = False
    if variant == "bf16":
        model.to(torch.bfloat16)
    model.to(device)
    model.train()
    return model


def describe(variant: str, compute_dtype: torch.dtype) -> str:
    """The peer's name in the report."""
    dtype = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype)
    if variant == "mixed" and dtype is None:
        return "fp32 weights, no autocast"
    return VARIANTS[variant].format(dtype=dtype)


def run_peer(
    config: Any,
    train: Any,
    packed: bool,
    pad_id: int,
    pad_to: int | None,
    device: torch.device,
    compute_dtype: torch.dtype,
    variant: str,
    warmup: int,
    steps: int,
) -> tuple[Timed, float]:
    """Build the peer and time its steps over ``train`` (the ktrain side's rows); return the timing and the
    training FLOPs a token of its model. Everything it built is freed when it returns."""
    torch.manual_seed(config.seed)
    model = build_model(config, device, variant)
    fused = device.type == "cuda"
    optimizer = torch.optim.AdamW(
        param_groups(model, config.weight_decay),
        lr=config.learning_rate,
        betas=(config.adam_beta1, config.adam_beta2),
        eps=config.adam_epsilon,
        fused=fused,
    )
    autocast = (
        torch.autocast(device.type, dtype=compute_dtype)
        if variant == "mixed" and compute_dtype != torch.float32
        else contextlib.nullcontext()
    )
    clip = config.max_grad_norm or math.inf  # 0 or null: no clipping, as in the kernel
    timeline = Timeline(device)

    def step(i: int) -> tuple[torch.Tensor, int]:
        micros = train.step(i)[0]
        tokens = 0
        loss_sum = torch.zeros((), device=device)
        for rows in micros:
            batch = collate(rows, pad_id, pad_to, "sdpa" if packed else None, device)
            batch = {k: v.to(device, non_blocking=True) for k, v in batch.items()}
            tokens += sum(row_tokens(row) for row in rows)
            timeline.mark("data")
            with autocast:
                loss = model(**batch).loss / len(micros)
            loss.backward()
            loss_sum += loss.detach().float()
            timeline.mark("forward_backward")
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        timeline.mark("optimizer")
        return loss_sum, tokens

    return run_steps(step, warmup, steps, timeline), flops_per_token(model, config.sequence_len)
