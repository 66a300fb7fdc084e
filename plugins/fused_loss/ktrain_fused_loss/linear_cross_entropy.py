"""The output layer and the token-sum cross entropy in one autograd function, with no host synchronization.

``linear_cross_entropy(hidden, weight, labels, divisor, chunks)`` returns ``sum of the trained tokens'
losses / divisor`` for ``logits = hidden @ weight.T``. The forward computes the logits chunk by chunk and
overwrites each chunk with its gradient (``cross_entropy_``: a Triton kernel on CUDA, PyTorch elsewhere),
so the logits never exist in fp32 and never twice:

- ``chunks == 1``: the whole gradient of the logits (tokens x vocab in the compute dtype) is kept for the
  backward, which runs the two products of the output layer's backward once each, at full size. The
  incoming gradient scales the small operands (the hidden states, the hidden states' gradient), not the
  logits;
- ``chunks > 1``: each chunk's products run in the forward (the hidden states' gradient into its rows,
  the weight's gradient accumulated), and only those two gradients are kept; the backward multiplies them
  by the incoming gradient. Less memory, smaller products.

The divisor is a device tensor and no value is read to the host (Liger's fused loss reads the count of
trained tokens in its forward and compares the incoming gradient with 1 in its backward: two waits for
the device a step).
"""

from __future__ import annotations

import torch

IGNORE_INDEX = -100


def softmax_minus_onehot(
    logits: torch.Tensor, labels: torch.Tensor, losses: torch.Tensor, ignore_index: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's loss into ``losses`` (0 where ignored); return ``softmax - onehot(label)`` in fp32 and which
    rows are trained: what the loss kernels compute, in PyTorch operations."""
    full = logits.float()
    lse = full.logsumexp(-1)
    valid = labels != ignore_index
    safe = torch.where(valid, labels, 0)
    losses.copy_(torch.where(valid, lse - full.gather(1, safe[:, None])[:, 0], 0.0))
    grad = full.sub_(lse[:, None]).exp_()
    grad.scatter_add_(1, safe[:, None], torch.full_like(lse, -1.0)[:, None])
    return grad, valid


def _cross_entropy_torch(
    logits: torch.Tensor, labels: torch.Tensor, divisor: torch.Tensor, losses: torch.Tensor, ignore_index: int
) -> None:
    """``cross_entropy_`` in PyTorch operations, for a CPU: the same results, computed in fp32."""
    grad, valid = softmax_minus_onehot(logits, labels, losses, ignore_index)
    logits.copy_(grad.mul_((valid / divisor)[:, None]))


def cross_entropy_(
    logits: torch.Tensor, labels: torch.Tensor, divisor: torch.Tensor, losses: torch.Tensor, ignore_index: int
) -> None:
    """Each row's loss into ``losses``; the gradient of ``sum(losses) / divisor`` written over ``logits``."""
    if logits.is_cuda:
        from ktrain_fused_loss.cross_entropy_triton import cross_entropy_ as on_gpu

        on_gpu(logits, labels, divisor, losses, ignore_index)
    else:
        _cross_entropy_torch(logits, labels, divisor, losses, ignore_index)


class LinearCrossEntropy(torch.autograd.Function):
    """``sum(cross_entropy(hidden @ weight.T, labels)) / divisor``, its gradients computed in the forward."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, divisor, chunks, ignore_index):
        tokens = hidden.shape[0]
        losses = torch.empty(tokens, device=hidden.device, dtype=torch.float32)
        ctx.chunks = chunks
        if chunks == 1:
            grad_logits = hidden @ weight.t()
            cross_entropy_(grad_logits, labels, divisor, losses, ignore_index)
            ctx.save_for_backward(hidden, weight, grad_logits)
            return losses.sum() / divisor
        grad_hidden = torch.empty_like(hidden)
        grad_weight = None
        size = -(-tokens // chunks)
        for start in range(0, tokens, size):
            rows = slice(start, start + size)
            grad_logits = hidden[rows] @ weight.t()
            cross_entropy_(grad_logits, labels[rows], divisor, losses[rows], ignore_index)
            torch.mm(grad_logits, weight, out=grad_hidden[rows])
            if ctx.needs_input_grad[1]:
                if grad_weight is None:
                    grad_weight = grad_logits.t() @ hidden[rows]
                else:
                    grad_weight.addmm_(grad_logits.t(), hidden[rows])
            del grad_logits
        ctx.save_for_backward(grad_hidden, grad_weight)
        return losses.sum() / divisor

    @staticmethod
    def backward(ctx, grad_output):
        if ctx.chunks == 1:
            hidden, weight, grad_logits = ctx.saved_tensors
            grad_hidden = (grad_logits @ weight).mul_(grad_output)
            grad_weight = None
            if ctx.needs_input_grad[1]:
                grad_weight = grad_logits.t() @ (hidden * grad_output)  # a 0-d fp32 factor keeps the dtype
            return grad_hidden, grad_weight, None, None, None, None
        grad_hidden, grad_weight = ctx.saved_tensors
        grad_hidden = grad_hidden.mul_(grad_output)
        if grad_weight is not None:
            grad_weight = grad_weight.mul_(grad_output)
        return grad_hidden, grad_weight, None, None, None, None


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    divisor: torch.Tensor,
    chunks: int = 1,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Token-sum cross entropy of ``hidden @ weight.T`` against ``labels``, divided by ``divisor``.

    ``hidden`` is (tokens, hidden) and ``labels`` (tokens,), already shifted; ``divisor`` a 0-d device
    tensor. Under autocast the products run in its dtype. ``chunks`` trades memory for speed: the forward
    holds the logits of ``tokens / chunks`` rows at a time, and with one chunk the gradient of all of them
    until the backward.
    """
    device = hidden.device.type
    if torch.is_autocast_enabled(device):  # the products in the autocast dtype, as nn.Linear's would run
        dtype = torch.get_autocast_dtype(device)
        hidden, weight = hidden.to(dtype), weight.to(dtype)
    divisor = torch.as_tensor(divisor, device=hidden.device, dtype=torch.float32)
    with torch.autocast(device, enabled=False):
        return LinearCrossEntropy.apply(hidden, weight, labels, divisor, chunks, ignore_index)
