"""Per-token log-probabilities of chosen targets, computed through the output layer chunk by chunk.

``add_logps_head(model)`` gives a causal LM's ``forward`` a keyword ``logps_targets`` (the ids each
position's next token is scored against, -100 where none is): with it, the forward runs the backbone and
returns ``[batch, length - 1]`` fp32 log-probabilities (0 where no target is), computed only at the
positions that have a target, a chunk of rows at a time under activation checkpointing: no
``[batch, length, vocab]`` logits exist, in fp32 or at all, and the backward recomputes each chunk's
logits. The forward is patched on the instance, so data parallelism's wrappers, an adapter (which calls
the base model's forward) and sharding hooks see one ordinary call of the model. Where the output layer is
not a plain product (a bias, logit scaling or soft-capping, a sharded or partitioned weight), the original
forward's logits are used instead, with the same result.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils.checkpoint import checkpoint

from ktrain.data.formats import IGNORE

# Logit elements of one chunk (fp32: 1 GiB): rows = CHUNK_ELEMENTS // vocabulary size.
CHUNK_ELEMENTS = 2**28
# Text-config attributes that scale or cap the logits: the output layer is then not a plain product.
SCALED = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def from_logits(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """``[batch, length - 1]`` log-probabilities of ``targets[:, 1:]`` under ``logits[:, :-1]`` (0 at -100)."""
    shifted = targets[:, 1:]
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logps.gather(-1, shifted.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return picked * (shifted != IGNORE)


def _rows_logps(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = (hidden @ weight.t()).float()
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - logits.logsumexp(-1)


def chunked(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int) -> torch.Tensor:
    """``[batch, length - 1]`` log-probabilities of ``targets[:, 1:]`` for the logits ``hidden @ weight.T``,
    ``rows`` positions at a time; the positions without a target are not computed."""
    shifted = targets[:, 1:]
    where = shifted != IGNORE
    picked_hidden, picked = hidden[:, :-1][where], shifted[where]
    parts = [
        checkpoint(_rows_logps, picked_hidden[i : i + rows], weight, picked[i : i + rows], use_reentrant=False)
        for i in range(0, len(picked), rows)
    ]
    out = torch.zeros(shifted.shape, dtype=torch.float32, device=hidden.device)
    return out.masked_scatter(where, torch.cat(parts)) if parts else out


def plain_head(model: Any) -> bool:
    """Whether the model's logits are its last hidden states times the output layer's weight, nothing more."""
    head = model.get_output_embeddings()
    text = model.config.get_text_config()
    return (
        isinstance(head, torch.nn.Linear)
        and head.bias is None
        and head.weight.dtype.is_floating_point
        and all(getattr(text, name, None) in (None, 1.0) for name in SCALED)
    )


def _logps_forward(
    model: Any, original: Any, *args: Any, logps_targets: torch.Tensor | None = None, labels: Any = None, **kwargs: Any
) -> Any:
    """The model's forward; with ``logps_targets``, the targets' log-probabilities instead of the logits."""
    if logps_targets is None:
        return original(*args, labels=labels, **kwargs)
    weight = model.get_output_embeddings().weight
    if isinstance(weight, DTensor) or hasattr(weight, "ds_id"):  # sharded apart from the model, or partitioned
        return from_logits(original(*args, **kwargs).logits, logps_targets)
    hidden = getattr(model, model.base_model_prefix)(*args, **kwargs).last_hidden_state
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    with torch.autocast(device, enabled=False):  # the product in the dtype nn.Linear would run it in
        return chunked(hidden.to(dtype), weight.to(dtype), logps_targets, max(1, CHUNK_ELEMENTS // weight.shape[0]))


def add_logps_head(model: Any) -> bool:
    """Give ``model`` (a causal LM, before any adapter wraps it) the ``logps_targets`` keyword; False (and no
    change) when its output layer is not a plain product."""
    if not plain_head(model):
        return False
    model.forward = functools.partial(_logps_forward, model, model.forward)
    return True


def token_logps(model: Any, inputs: dict[str, Any], targets: torch.Tensor, head: bool) -> torch.Tensor:
    """``[batch, length - 1]`` log-probabilities of ``targets[:, 1:]`` from one call of ``model``: through the
    chunked head when the model has it (``head``), else from its logits."""
    if head:
        return model(**inputs, logps_targets=targets)
    return from_logits(model(**inputs).logits, targets)
