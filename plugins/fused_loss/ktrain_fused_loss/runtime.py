"""The runtime object of ``fused_linear_cross_entropy: true``: the model's forward computes its loss fused.

The causal LM's ``forward`` is replaced by an instance attribute (the module, its parameter names and its
hooks stay): with labels it runs the backbone, shifts the labels as Hugging Face's causal-LM loss does
(or takes ``shift_labels``), and hands the last hidden states and the output layer's weight to
``linear_cross_entropy`` (``linear_cross_entropy_float8`` with ``fused_linear_cross_entropy_fp8``), dividing by
``num_items_in_batch`` (the kernel's count of trained tokens, a device tensor) or, without it, by the count of
trained tokens. It returns no logits. Without labels (generation, evaluation of logits) the original forward
runs.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
import transformers
from transformers.modeling_outputs import CausalLMOutputWithPast

from ktrain import hookimpl
from ktrain.config.report import ConfigError, Report
from ktrain_fused_loss.float8_output import linear_cross_entropy_float8
from ktrain_fused_loss.keys import SUPPORTED
from ktrain_fused_loss.linear_cross_entropy import IGNORE_INDEX, linear_cross_entropy

Loss = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``(hidden, weight, labels, divisor) -> loss``: ``linear_cross_entropy``'s arguments without the options."""


class FusedLoss:
    """Owner of ``op:fused_linear_cross_entropy``: patches the bare model before any adapter wraps it."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> None:
        """Stop before the model loads when its architecture is not one whose output layer and loss are plain."""
        source = self.config.base_model_config or self.config.base_model
        kind = transformers.AutoConfig.from_pretrained(source, trust_remote_code=self.config.trust_remote_code)
        if kind.model_type not in SUPPORTED:
            report = Report(self.config.source)
            report.error(
                "fused_linear_cross_entropy",
                f"supports model_type {', '.join(SUPPORTED)}, not '{kind.model_type}' (its output layer or loss "
                "is not a plain product and cross entropy); remove the key",
            )
            raise ConfigError(report)

    @hookimpl(tryfirst=True)
    def ktrain_wrap_model(self, model: torch.nn.Module, run: Any) -> None:
        """Replace the model's forward (first, so that an adapter wraps the patched model)."""
        head = model.get_output_embeddings()
        if getattr(head, "bias", None) is not None:
            report = Report(self.config.source)
            report.error("fused_linear_cross_entropy", "the output layer has a bias, which the fused loss lacks")
            raise ConfigError(report)
        chunks = self.config.fused_linear_cross_entropy_chunks
        if self.config.fused_linear_cross_entropy_fp8:
            loss, how = linear_cross_entropy_float8, "float8 products"
        else:
            loss, how = functools.partial(linear_cross_entropy, chunks=chunks), f"{chunks} chunk(s)"
        model.forward = functools.partial(fused_forward, model, model.forward, loss)
        if run.is_main:
            print(f"fused_loss: {type(model).__name__} output layer and loss fused, {how}", flush=True)


def fused_forward(
    model: torch.nn.Module,
    original: Any,
    loss: Loss,
    input_ids: torch.Tensor | None = None,
    labels: torch.Tensor | None = None,
    num_items_in_batch: torch.Tensor | None = None,
    shift_labels: torch.Tensor | None = None,
    logits_to_keep: int = 0,
    **kwargs: Any,
) -> CausalLMOutputWithPast:
    """The causal LM's forward with the loss fused into the output layer (no logits) when labels are given."""
    if labels is None and shift_labels is None:
        return original(input_ids=input_ids, logits_to_keep=logits_to_keep, **kwargs)
    out = getattr(model, model.base_model_prefix)(input_ids=input_ids, **kwargs)
    if shift_labels is None:
        shift_labels = F.pad(labels, (0, 1), value=IGNORE_INDEX)[..., 1:]
    hidden = out.last_hidden_state
    targets = shift_labels.reshape(-1).to(hidden.device)
    divisor = (targets != IGNORE_INDEX).sum() if num_items_in_batch is None else num_items_in_batch
    value = loss(hidden.reshape(-1, hidden.shape[-1]), model.get_output_embeddings().weight, targets, divisor)
    return CausalLMOutputWithPast(loss=value, hidden_states=out.hidden_states, attentions=out.attentions)
