"""The fused output layer and loss with the output layer's three products in float8.

``linear_cross_entropy_float8(hidden, weight, labels, divisor)`` returns what ``linear_cross_entropy`` returns
(``sum of the trained tokens' losses / divisor`` for ``logits = hidden @ weight.T``), with the products run by
``torch._scaled_mm`` on float8 operands, as torchao's tensorwise recipe runs a linear layer's:

- the hidden states and the weight are cast to e4m3 with one scale each (the format's largest value over the
  tensor's absolute maximum), each in the two layouts the products read;
- the logits come out in bf16, a chunk of rows at a time (at most ``CHUNK_LOGITS`` of them), and the loss's
  kernel writes their gradient straight in e5m2, in both layouts. Its scale needs no pass over the tensor:
  ``softmax - onehot`` lies in (-1, 1), so it is multiplied by ``GRAD_SCALE``, and the divisor and the
  incoming gradient go into the inverse scale of the backward's products.

The gradient held from the forward to the backward is then two float8 copies of the logits' gradient: as many
bytes as the one bf16 copy of ``linear_cross_entropy``; the weight is held in float8 too, and a chunk's logits in
bf16 only while its loss is computed. The forward's product accumulates the fast way, as torchao's forward
does; the backward's do not. Dimensions that are not multiples of 16 are padded with zeros (``MULTIPLE``).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F

from ktrain_fused_loss.linear_cross_entropy import IGNORE_INDEX, softmax_minus_onehot

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
GRAD_SCALE = 2.0**15
"""The logits' gradient is ``(softmax - onehot) * GRAD_SCALE`` in e5m2 (largest value 57,344): a power of two,
so undoing it is exact, and small probabilities stay above e5m2's smallest values."""
CHUNK_LOGITS = 1 << 28
"""The most logits computed at once (512 MiB in bf16)."""
MULTIPLE = 16
"""Float8 products need each dimension a multiple of 16 (``torch._scaled_mm`` on a GPU): the operands are padded
with zeros to one, and the padded columns of the logits are left out of the loss."""


def _padded(size: int) -> int:
    return -(-size // MULTIPLE) * MULTIPLE


def _cast_eager(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``x``, padded with zeros to multiples of 16, in e4m3 with one scale, row-major; its transpose in e4m3,
    row-major; and the inverse scale."""
    rows, cols = x.shape
    if rows % MULTIPLE or cols % MULTIPLE:
        x = F.pad(x, (0, _padded(cols) - cols, 0, _padded(rows) - rows))
    limit = torch.finfo(E4M3).max
    scale = limit / x.abs().amax().float().clamp(min=1e-12)
    y = (x.float() * scale).clamp(-limit, limit).to(E4M3)
    return y, y.t().contiguous(), scale.reciprocal()


@functools.cache
def _cast_compiled():
    return torch.compile(_cast_eager)


def to_e4m3(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``_cast_eager``, compiled on a GPU (one read for the maximum, one for both casts) and eager elsewhere."""
    return _cast_compiled()(x) if x.is_cuda else _cast_eager(x)


def _mm(a: torch.Tensor, b: torch.Tensor, scale_a, scale_b, out_dtype: torch.dtype, fast: bool) -> torch.Tensor:
    """``torch._scaled_mm`` with what a GPU requires checked everywhere: ``a`` row-major, ``b`` column-major, every
    dimension a multiple of 16."""
    assert a.stride(1) == 1 and b.stride(0) == 1, "float8 products need a row-major and a column-major operand"
    assert not (a.shape[1] % MULTIPLE or b.shape[0] % MULTIPLE or b.shape[1] % MULTIPLE), (a.shape, b.shape)
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=out_dtype, use_fast_accum=fast)


def _cross_entropy_float8_torch(logits, labels, losses, grad, grad_t, scale: float, ignore_index: int) -> None:
    """The Triton kernels' results in PyTorch operations, for a CPU (computed in fp32)."""
    full, valid = softmax_minus_onehot(logits, labels, losses, ignore_index)
    vocab = logits.shape[1]
    grad[:, :vocab].copy_(full.mul_((valid * scale)[:, None]))
    grad[:, vocab:] = 0
    grad_t.copy_(grad.t())


class LinearCrossEntropyFloat8(torch.autograd.Function):
    """``sum(cross_entropy(hidden @ weight.T, labels)) / divisor`` with float8 products."""

    @staticmethod
    def forward(ctx, hidden, weight, labels, divisor, out_dtype, ignore_index):
        (tokens, features), vocab = hidden.shape, weight.shape[0]
        h8, h8_t, h_inverse = to_e4m3(hidden)
        w8, w8_t, w_inverse = to_e4m3(weight)
        rows, width = h8.shape[0], w8.shape[0]  # padded
        labels = F.pad(labels, (0, rows - tokens), value=ignore_index)
        losses = torch.empty(rows, device=hidden.device, dtype=torch.float32)
        grad = torch.empty(rows, width, device=hidden.device, dtype=E5M2)
        grad_t = torch.empty(width, rows, device=hidden.device, dtype=E5M2)
        kernel = _cross_entropy_float8_torch
        if hidden.is_cuda:
            from ktrain_fused_loss.float8_triton import cross_entropy_float8 as kernel
        size = max(MULTIPLE, CHUNK_LOGITS // width // MULTIPLE * MULTIPLE)
        for start in range(0, rows, size):
            chunk = slice(start, start + size)
            logits = _mm(h8[chunk], w8.t(), h_inverse, w_inverse, out_dtype, fast=True)
            kernel(
                logits[:, :vocab], labels[chunk], losses[chunk], grad[chunk], grad_t[:, chunk], GRAD_SCALE, ignore_index
            )
            del logits
        ctx.save_for_backward(grad, grad_t, w8_t, h8_t, h_inverse, w_inverse, divisor)
        ctx.dtypes, ctx.sizes = (hidden.dtype, weight.dtype), (tokens, features, vocab)
        return losses.sum() / divisor

    @staticmethod
    def backward(ctx, grad_output):
        grad, grad_t, w8_t, h8_t, h_inverse, w_inverse, divisor = ctx.saved_tensors
        tokens, features, vocab = ctx.sizes
        g_inverse = (grad_output.float() / (divisor * GRAD_SCALE)).reshape(())
        grad_hidden = _mm(grad, w8_t.t(), g_inverse, w_inverse, ctx.dtypes[0], fast=False)[:tokens, :features]
        grad_weight = None
        if ctx.needs_input_grad[1]:
            grad_weight = _mm(grad_t, h8_t.t(), g_inverse, h_inverse, ctx.dtypes[1], fast=False)[:vocab, :features]
        return grad_hidden, grad_weight, None, None, None, None


def linear_cross_entropy_float8(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    labels: torch.Tensor,
    divisor: torch.Tensor,
    ignore_index: int = IGNORE_INDEX,
) -> torch.Tensor:
    """Token-sum cross entropy of ``hidden @ weight.T`` against ``labels``, divided by ``divisor``, the products in
    float8. ``hidden`` is (tokens, hidden) and ``labels`` (tokens,), already shifted. The logits come out in
    the autocast dtype under autocast, else in the hidden states' (each operand is cast to float8 from its own
    dtype); the gradients in their tensors' dtypes."""
    device = hidden.device.type
    out_dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else hidden.dtype
    divisor = torch.as_tensor(divisor, device=hidden.device, dtype=torch.float32)
    with torch.autocast(device, enabled=False):
        return LinearCrossEntropyFloat8.apply(hidden, weight, labels, divisor, out_dtype, ignore_index)
