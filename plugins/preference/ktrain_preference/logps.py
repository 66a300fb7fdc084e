"""Log-probabilities of chosen tokens at chosen positions, computed through the output layer chunk by chunk.

A scored token is given by its row, the position whose hidden state predicts it, and its id: ``at`` is a
``[3, tokens]`` tensor of the three. ``add_logps_head(model)`` gives a causal LM's ``forward`` a keyword
``logps_at``: with it, the forward runs the backbone and returns the ``[tokens]`` fp32 log-probabilities,
computed at those positions only, a chunk of them at a time: no ``[batch, length, vocab]`` fp32 logits exist.
A trained output layer keeps its logits' gradients (in the compute dtype) from the forward to the backward
while they are few enough (``KEPT_ELEMENTS``), else only each token's log-sum-exp (the backward recomputes the
logits); a frozen one's (LoRA, QLoRA) give each token's gradient in the forward, and are computed once.
On CUDA the element-wise work over a chunk's logits is compiled into kernels that read them once each.
Explicit positions let two answers that follow one prompt in one row both be predicted from the prompt's last
position. The forward is patched on the instance, so data parallelism's wrappers, an adapter (which calls
the base model's forward) and sharding hooks see one ordinary call of the model. Where the output layer is
not a plain product (a bias, logit scaling or soft-capping, a sharded or partitioned weight), the original
forward's logits are used instead, with the same result.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch.distributed.tensor import DTensor
from torch.utils._triton import has_triton

from ktrain.data.formats import IGNORE

# Logit elements of one chunk (fp32: 1 GiB): rows = CHUNK_ELEMENTS // vocabulary size.
CHUNK_ELEMENTS = 2**28
# Logit elements of a micro-batch up to which a trained output layer keeps their gradients from the forward to the
# backward (bf16: 1 GiB), instead of computing the logits again (``TrainedHeadLogps``).
KEPT_ELEMENTS = 2**29
# Text-config attributes that scale or cap the logits: the output layer is then not a plain product.
SCALED = ("final_logit_softcapping", "logit_scale", "output_multiplier", "lm_head_multiplier", "logits_scaling")


def shifted(labels: torch.Tensor) -> torch.Tensor:
    """``at`` of the labelled tokens of rows ``labels`` ``[batch, length]``: each predicted from the position before
    it, in the order of the rows and then their positions."""
    rows, positions = (labels[:, 1:] != IGNORE).nonzero(as_tuple=True)
    return torch.stack([rows, positions, labels[rows, positions + 1]])


def from_logits(logits: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """``[tokens]`` log-probabilities of the tokens ``at[2]`` under ``logits`` at rows ``at[0]``, positions
    ``at[1]``."""
    logps = torch.log_softmax(logits[at[0], at[1]].float(), dim=-1)
    return logps.gather(-1, at[2].unsqueeze(-1)).squeeze(-1)


def _scores(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's log-probability of its target and its log-sum-exp (fp32), from ``logits`` ``[rows, vocab]``."""
    wide = logits.float()
    norm = wide.logsumexp(-1)
    return wide.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - norm, norm


def _slopes(logits: torch.Tensor, targets: torch.Tensor, norm: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``scale * (onehot(target) - softmax)`` of each row, in the logits' dtype: the gradient of the row's
    log-probability with respect to its logits, times ``scale``."""
    onehot = torch.arange(logits.shape[-1], device=logits.device) == targets.unsqueeze(-1)
    softmax = (logits.float() - norm.unsqueeze(-1)).exp()
    return ((onehot.float() - softmax) * scale.unsqueeze(-1)).to(logits.dtype)


@functools.cache
def _fused(function: Any) -> Any:
    """``function`` compiled, so that its element-wise work over a chunk's logits runs as one or two kernels that
    read the logits once each (eager PyTorch makes several fp32 passes); used on CUDA where Triton is present."""
    return torch.compile(function, dynamic=None)


def _on(logits: torch.Tensor, function: Any) -> Any:
    return _fused(function) if logits.is_cuda and has_triton() else function


def chunked(hidden: torch.Tensor, weight: torch.Tensor, at: torch.Tensor, rows: int) -> torch.Tensor:
    """``[tokens]`` log-probabilities of the tokens ``at[2]`` for the logits ``hidden[at[0], at[1]] @ weight.T``,
    ``rows`` tokens at a time; no other position is computed. A frozen ``weight`` (an adapter's base, a reference)
    takes ``FrozenHeadLogps``, a trained one ``TrainedHeadLogps``."""
    picked_hidden, picked = hidden[at[0], at[1]], at[2]
    if not weight.requires_grad:
        return FrozenHeadLogps.apply(picked_hidden, weight, picked, rows)
    kept = torch.is_grad_enabled() and len(picked) * weight.shape[0] <= KEPT_ELEMENTS  # a backward will follow
    return TrainedHeadLogps.apply(picked_hidden, weight, picked, rows, kept)


class TrainedHeadLogps(torch.autograd.Function):
    """Log-probabilities through a trained output layer, a chunk of tokens at a time.

    Where the micro-batch's logits number at most ``KEPT_ELEMENTS`` and a backward will follow, the forward keeps
    each chunk's gradient of the log-probabilities with respect to its logits (``onehot - softmax``, in the logits'
    dtype) and their product with the weight (the hidden states' gradient, as ``FrozenHeadLogps`` finds it): the
    backward scales them by the incoming gradient and computes no logits again (the weight's gradient is
    ``slopes.T @ (incoming * hidden)``).
    Above it, the forward keeps each token's log-sum-exp only, and the backward computes each chunk's logits again
    and turns them into their gradient (``incoming * (onehot - softmax)``) in one pass.
    """

    @staticmethod
    def forward(
        ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int, kept: bool
    ) -> Any:
        values = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)
        norms = torch.empty_like(values)
        shape = (len(targets) if kept and ctx.needs_input_grad[0] else 0, hidden.shape[1])
        slopes, hidden_slopes = [], torch.empty(shape, dtype=torch.float32, device=hidden.device)
        for i in range(0, len(targets), rows):
            logits, part = hidden[i : i + rows] @ weight.t(), slice(i, i + rows)
            values[part], norms[part] = _on(logits, _scores)(logits, targets[part])
            if kept:
                slopes.append(_on(logits, _slopes)(logits, targets[part], norms[part], torch.ones_like(norms[part])))
                if len(hidden_slopes):
                    hidden_slopes[part] = slopes[-1] @ weight
        ctx.save_for_backward(hidden, weight, targets, norms, hidden_slopes, *slopes)
        ctx.rows, ctx.kept = rows, kept
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None, None, None, None]:
        hidden, weight, targets, norms, hidden_slopes, *slopes = ctx.saved_tensors
        rows, (hidden_wanted, weight_wanted) = ctx.rows, ctx.needs_input_grad[:2]
        if ctx.kept:
            hidden_grad = (grad.unsqueeze(-1) * hidden_slopes).to(hidden.dtype) if hidden_wanted else None
            weight_grad = None
            for i, slope in zip(range(0, len(targets), rows), slopes, strict=True):
                if weight_wanted:
                    scaled = (grad[i : i + rows].unsqueeze(-1) * hidden[i : i + rows]).to(hidden.dtype)
                    if weight_grad is None:  # the first chunk's product, then the others added in place
                        weight_grad = slope.t() @ scaled
                    else:
                        weight_grad.addmm_(slope.t(), scaled)
            return hidden_grad, weight_grad, None, None, None
        hidden_grad = torch.empty_like(hidden) if hidden_wanted else None
        weight_grad = torch.zeros_like(weight) if weight_wanted else None
        for i in range(0, len(targets), rows):
            logits = hidden[i : i + rows] @ weight.t()
            part = slice(i, i + rows)
            slope = _on(logits, _slopes)(logits, targets[part], norms[part], grad[part].float())
            del logits
            if hidden_grad is not None:
                torch.mm(slope, weight, out=hidden_grad[part])
            if weight_grad is not None:
                weight_grad.addmm_(slope.t(), hidden[part])
        return hidden_grad, weight_grad, None, None, None


class FrozenHeadLogps(torch.autograd.Function):
    """Log-probabilities through a frozen output layer, each token's gradient found in the forward.

    A token's log-probability depends on its own hidden state alone, so its gradient with respect to that state
    is one vector, ``(onehot - softmax) @ weight``, whatever the loss does with it; the forward computes it while
    the chunk's logits exist (fp32, ``[tokens, hidden]``), and the backward scales it by the incoming gradient.
    The logits are computed once, not again in the backward.
    """

    @staticmethod
    def forward(ctx: Any, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, rows: int) -> Any:
        wanted = ctx.needs_input_grad[0]
        values = torch.empty(len(targets), dtype=torch.float32, device=hidden.device)
        shape = (len(targets) if wanted else 0, hidden.shape[1])
        slopes = torch.empty(shape, dtype=torch.float32, device=hidden.device)
        for i in range(0, len(targets), rows):
            logits, chunk = hidden[i : i + rows] @ weight.t(), targets[i : i + rows]
            values[i : i + rows], norm = _on(logits, _scores)(logits, chunk)
            if wanted:
                ones = torch.ones_like(norm)
                slopes[i : i + rows] = _on(logits, _slopes)(logits, chunk, norm, ones) @ weight
        ctx.save_for_backward(slopes)
        ctx.dtype = hidden.dtype
        return values

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None, None]:
        (slopes,) = ctx.saved_tensors
        return (grad.unsqueeze(-1) * slopes).to(ctx.dtype), None, None, None


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
    model: Any, original: Any, *args: Any, logps_at: torch.Tensor | None = None, labels: Any = None, **kwargs: Any
) -> Any:
    """The model's forward; with ``logps_at``, those tokens' log-probabilities instead of the logits."""
    if logps_at is None:
        return original(*args, labels=labels, **kwargs)
    weight = model.get_output_embeddings().weight
    if isinstance(weight, DTensor) or hasattr(weight, "ds_id"):  # sharded apart from the model, or partitioned
        return from_logits(original(*args, **kwargs).logits, logps_at)
    hidden = getattr(model, model.base_model_prefix)(*args, **kwargs).last_hidden_state
    device = hidden.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else weight.dtype
    with torch.autocast(device, enabled=False):  # the product in the dtype nn.Linear would run it in
        return chunked(hidden.to(dtype), weight.to(dtype), logps_at, max(1, CHUNK_ELEMENTS // weight.shape[0]))


def add_logps_head(model: Any) -> bool:
    """Give ``model`` (a causal LM, before any adapter wraps it) the ``logps_at`` keyword; False (and no change)
    when its output layer is not a plain product."""
    if not plain_head(model):
        return False
    model.forward = functools.partial(_logps_forward, model, model.forward)
    return True


def token_logps(model: Any, inputs: dict[str, Any], at: torch.Tensor, head: bool) -> torch.Tensor:
    """``[tokens]`` log-probabilities of the tokens ``at`` names, from one call of ``model``: through the chunked
    head when the model has it (``head``), else from its logits."""
    if head:
        return model(**inputs, logps_at=at)
    return from_logits(model(**inputs).logits, at)


def group_sums(values: torch.Tensor, slots: torch.Tensor, groups: int, width: int) -> torch.Tensor:
    """``[groups]`` sums of ``values``, each in group ``slots[0]`` at place ``slots[1]`` (below ``width``): summed in
    the order of their places, the same on every device and run (no atomic adds)."""
    table = torch.zeros((groups, width), dtype=values.dtype, device=values.device)
    return table.index_put_((slots[0], slots[1]), values).sum(-1)
