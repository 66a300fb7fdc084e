"""``fp8_fused_mlp``: a SwiGLU MLP whose three delayed-scaling float8 layers run as one function.

Layer by layer, the MLP's backward leaves the gradients of the gate and up projections' outputs to compiled
code between the layers: the SiLU's gradient, each gradient's absolute maximum and its float8 copies in two
layouts, and the down projection's input cast again for its weight's gradient. Inductor spreads that over
several passes over the intermediate features (tokens x 8,192 on the 1.5B shape), and writes fp32 and bf16
intermediates between them: on the 1.5B shape 3.8 GB of traffic a block, against 1.3 GB for the same part of
bf16's backward. With delayed scaling every scale is known before the pass, so one pass can do all of it:
``swiglu_backward_float8`` (Triton on a GPU, ``ktrain_fp8.swiglu_triton``; this module's PyTorch version
elsewhere) reads the three tensors once: 1.5 GB read and written. The forward's activation, its float8 copy
and its maximum are one pass too (``swiglu_forward_float8``), where inductor reads the gate and up projections'
outputs twice.

The MLP keeps its three layers as submodules (the same parameter names, scales and histories); its forward
is ``down(silu(gate(x)) * up(x))``, each product in float8 as in ``ktrain_fp8.delayed``, and the input is cast
once for the gate and the up projection. The first micro-step (no history) takes each tensor's own scale.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ktrain_fp8.delayed import (
    E4M3,
    E5M2,
    DelayedFloat8Linear,
    abs_max,
    cast_saturated,
    own_scale,
    pad_rows,
)

SILU = ("SiLU", "SiLUActivation")
"""The activations' class names a fused MLP may have: torch's and transformers'."""


def _swiglu_gradients(grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """In fp32: the gate's and the up projection's output gradients, and the hidden activation."""
    a, b, g = gate.float(), up.float(), grad_h.float()
    sigmoid = torch.sigmoid(a)
    silu = a * sigmoid
    return g * b * sigmoid * (1 + a * (1 - sigmoid)), g * silu, silu * b


def swiglu_backward_float8_reference(
    grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """From the hidden activation's gradient ``grad_h`` and the ``gate`` and ``up`` outputs (tokens x features):
    the gate's output gradient in e5m2 (row-major, then transposed with the tokens padded to a multiple of 16),
    the up projection's likewise, the hidden activation ``silu(gate) * up`` transposed in e4m3, and the two
    gradients' absolute maxima; ``scales``: the two gradients' and the activation's."""
    d_gate, d_up, hidden = _swiglu_gradients(grad_h, gate, up)
    q_gate = cast_saturated(d_gate, scales[0], E5M2)
    q_up = cast_saturated(d_up, scales[1], E5M2)
    q_hidden = cast_saturated(hidden, scales[2], E4M3)
    maxima = torch.stack([abs_max(d_gate), abs_max(d_up)])
    transposed = (pad_rows(q).t().contiguous() for q in (q_gate, q_up, q_hidden))
    grad_gate_t, grad_up_t, hidden_t = transposed
    return q_gate, grad_gate_t, q_up, grad_up_t, hidden_t, maxima


def swiglu_forward_float8_reference(
    gate: torch.Tensor, up: torch.Tensor, scale: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The hidden activation ``silu(gate) * up`` in e4m3 at ``scale`` (row-major) and its absolute maximum."""
    hidden = F.silu(gate.float()) * up.float()
    return cast_saturated(hidden, scale, E4M3), abs_max(hidden)


def _swiglu_forward_float8(gate, up, scale):
    if gate.is_cuda:
        from ktrain_fp8.swiglu_triton import swiglu_forward_float8

        return swiglu_forward_float8(gate, up, scale)
    return swiglu_forward_float8_reference(gate, up, scale)


def _swiglu_backward_float8(grad_h, gate, up, scales):
    if gate.is_cuda:
        from ktrain_fp8.swiglu_triton import swiglu_backward_float8

        return swiglu_backward_float8(grad_h, gate, up, scales)
    return swiglu_backward_float8_reference(grad_h, gate, up, scales)


def _mm(a, b, scale_a, scale_b, dtype, fast: bool) -> torch.Tensor:
    return torch._scaled_mm(a, b, scale_a=scale_a, scale_b=scale_b, out_dtype=dtype, use_fast_accum=fast)


def _column_major(w8: torch.Tensor) -> torch.Tensor:
    """``w8`` (out x in) as the second operand of ``grad @ w8``: column-major."""
    return w8.t().contiguous().t()


class _Float8SwiGLU(torch.autograd.Function):
    """``down(silu(x @ gate.t()) * (x @ up.t()))`` with float8 products. The three scales: the gate's, the up
    projection's and the down projection's rows of ``DelayedScales`` (input, weight, output gradient), used where
    ``delayed`` is true. Returns the output and the three layers' (input, weight) absolute maxima; the backward
    hands each layer's output gradient's maximum to its sink."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, w_down, sink_gate, sink_up, sink_down, scale_gate, scale_up, scale_down,
                delayed: bool, fast_backward: bool):  # fmt: skip
        del sink_gate, sink_up, sink_down
        scales = (scale_gate, scale_up, scale_down)
        x2 = x.reshape(-1, x.shape[-1])
        weights = (w_gate, w_up, w_down)
        s_x = scales[0][0] if delayed else own_scale(x2, E4M3)
        s_w = [s[1] if delayed else own_scale(w, E4M3) for s, w in zip(scales, weights, strict=True)]
        x8 = cast_saturated(x2, s_x, E4M3)
        w8 = [cast_saturated(w, s, E4M3) for w, s in zip(weights, s_w, strict=True)]
        i_x, (i_gate, i_up, i_down) = s_x.reciprocal(), (s.reciprocal() for s in s_w)
        gate = _mm(x8, w8[0].t(), i_x, i_gate, x.dtype, True)
        up = _mm(x8, w8[1].t(), i_x, i_up, x.dtype, True)
        if delayed:
            s_h = scales[2][0]
            h8, h_max = _swiglu_forward_float8(gate, up, s_h)
        else:
            hidden = F.silu(gate.float()) * up.float()
            s_h = own_scale(hidden, E4M3)
            h8, h_max = cast_saturated(hidden, s_h, E4M3), abs_max(hidden)
        y = _mm(h8, w8[2].t(), s_h.reciprocal(), i_down, x.dtype, True)
        x_max = abs_max(x2)
        pairs = ((x_max, abs_max(w_gate)), (x_max, abs_max(w_up)), (h_max, abs_max(w_down)))
        amax = torch.stack([torch.stack(pair) for pair in pairs])
        ctx.mark_non_differentiable(amax)
        ctx.save_for_backward(x8, *w8, gate, up, i_x, i_gate, i_up, i_down, s_h, *(s[2] for s in scales))
        ctx.delayed, ctx.fast, ctx.shape, ctx.weight_dtype = delayed, fast_backward, x.shape, w_gate.dtype
        return y.view(*x.shape[:-1], -1), amax

    @staticmethod
    def backward(ctx, grad, _):
        x8, w8_gate, w8_up, w8_down, gate, up, i_x, i_gate, i_up, i_down, s_h, s_gate, s_up, s_down = ctx.saved_tensors
        fast, dtype, weight_dtype = ctx.fast, grad.dtype, ctx.weight_dtype
        g = grad.reshape(-1, grad.shape[-1])
        if not ctx.delayed:
            s_down = own_scale(g, E5M2)
        g8, i_g = cast_saturated(g, s_down, E5M2), s_down.reciprocal()
        grad_h = _mm(g8, _column_major(w8_down), i_g, i_down, dtype, fast)
        if not ctx.delayed:
            d_gate, d_up, _ = _swiglu_gradients(grad_h, gate, up)
            s_gate, s_up = own_scale(d_gate, E5M2), own_scale(d_up, E5M2)
        q_gate, q_gate_t, q_up, q_up_t, hidden_t, maxima = _swiglu_backward_float8(
            grad_h, gate, up, torch.stack([s_gate, s_up, s_h])
        )
        i_dgate, i_dup = s_gate.reciprocal(), s_up.reciprocal()
        grad_x = _mm(q_gate, _column_major(w8_gate), i_dgate, i_gate, dtype, fast)
        grad_x = grad_x + _mm(q_up, _column_major(w8_up), i_dup, i_up, dtype, fast)
        x8_t = pad_rows(x8).t().contiguous().t()
        grad_w_gate = _mm(q_gate_t, x8_t, i_dgate, i_x, weight_dtype, fast)
        grad_w_up = _mm(q_up_t, x8_t, i_dup, i_x, weight_dtype, fast)
        grad_w_down = _mm(pad_rows(g8).t().contiguous(), hidden_t.t(), i_g, s_h.reciprocal(), weight_dtype, fast)
        weight_grads = (grad_w_gate, grad_w_up, grad_w_down)
        sink_grads = (maxima[0], maxima[1], abs_max(g))
        return grad_x.view(ctx.shape), *weight_grads, *sink_grads, None, None, None, None, None


class DelayedFloat8SwiGLU(torch.nn.Module):
    """A SwiGLU MLP (``down_proj(silu(gate_proj(x)) * up_proj(x))``) whose three ``DelayedFloat8Linear`` layers
    run as one function; the layers stay its submodules under their names."""

    def __init__(self, gate_proj: DelayedFloat8Linear, up_proj: DelayedFloat8Linear, down_proj: DelayedFloat8Linear):
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layers = (self.gate_proj, self.up_proj, self.down_proj)
        calibrated = self.gate_proj.delayed_scales.calibrated
        sinks = tuple(layer.sink for layer in layers)
        scales = tuple(layer.scales for layer in layers)
        weights = (layer.weight for layer in layers)
        y, amax = _Float8SwiGLU.apply(x, *weights, *sinks, *scales, calibrated, self.gate_proj.fast_backward)
        if self.training and torch.is_grad_enabled():
            for layer, maxima in zip(layers, amax, strict=True):
                layer.amax.copy_(torch.maximum(layer.amax, maxima.detach()))
        return y


def _fusable(mlp: torch.nn.Module) -> bool:
    layers = [getattr(mlp, name, None) for name in ("gate_proj", "up_proj", "down_proj")]
    return (
        all(isinstance(layer, DelayedFloat8Linear) and layer.bias is None for layer in layers)
        and type(getattr(mlp, "act_fn", None)).__name__ in SILU
        and type(mlp).__name__.endswith("MLP")
    )


def fuse_swiglu(model: torch.nn.Module) -> list[str]:
    """Replace each SwiGLU MLP of ``model`` whose gate, up and down projections are all ``DelayedFloat8Linear``
    (no bias, SiLU) by a ``DelayedFloat8SwiGLU``; return the replaced modules' names."""
    fused = [name for name, module in model.named_modules() if _fusable(module)]
    for name in fused:
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent)
        mlp = getattr(owner, leaf)
        setattr(owner, leaf, DelayedFloat8SwiGLU(mlp.gate_proj, mlp.up_proj, mlp.down_proj))
    return fused
