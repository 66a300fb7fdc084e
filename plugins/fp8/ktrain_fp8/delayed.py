"""``fp8_recipe: delayed``: float8 linear layers whose scales come from the absolute maxima of earlier micro-steps.

torchao's tensorwise layers scale each tensor by its own absolute maximum: a pass over the tensor that must end
before its cast starts, so neither can be fused into the kernel that produced the tensor (the normalization, the
activation, the gradient of the next layer). Here each layer casts its input, its weight and its output's
gradient with scales known before the step: the format's largest value over the largest absolute maximum seen in
the last ``fp8_amax_history_len`` micro-steps, as Transformer Engine's delayed scaling does. Each cast tensor's
absolute maximum is still taken, beside its cast, for the scales that follow. A value beyond the scale's range
saturates to the format's largest (the casts clamp).

- The first micro-step has no history: its layers scale each tensor by its own maximum (torchao's tensorwise
  way), which also starts the history.
- One object (``DelayedScales``) holds every layer's history and scales, rolled by a forward pre-hook of the
  model before each training forward. The output gradient's maximum leaves the backward as the gradient of a
  scalar of its own (``sink``), so no tensor is written inside the compiled backward.
- Evaluation forwards (no gradient) use the scales and leave the history alone.
- The histories are the plugin's checkpoint state (``ktrain_collect_checkpoint_state``): a resumed run casts
  with the scales the uninterrupted one would have.

The layers keep their weight parameter (same name, dtype and gradient), so optimizers, master weights,
checkpoints and the exported model are those of bf16; the float8 input and weight are kept for the backward.
The forward's product accumulates the fast way and the backward's do not, as in torchao's recipes, unless
``fp8_fast_accumulation`` asks for them too.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
LIMITS = (torch.finfo(E4M3).max, torch.finfo(E4M3).max, torch.finfo(E5M2).max)
"""The largest value of each cast's format: the input, the weight (e4m3) and the output's gradient (e5m2)."""
MULTIPLE = 16
"""Float8 products need the dimensions they reduce over to be multiples of 16: the weight gradient's sum over the
tokens pads them with zero rows where their count is not one."""


def cast_saturated(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x`` times ``scale`` in ``dtype``, saturated, row-major (as the products' first operand must be)."""
    limit = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(dtype).contiguous()


def own_scale(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The scale of ``x`` from its own absolute maximum (the first micro-step's)."""
    return torch.finfo(dtype).max / x.abs().amax().float().clamp(min=1e-12)


def abs_max(x: torch.Tensor) -> torch.Tensor:
    """The largest absolute value of ``x``, in fp32."""
    return x.abs().amax().float()


def padded_rows(rows: int) -> int:
    """``rows`` rounded up to a multiple of ``MULTIPLE``."""
    return -(-rows // MULTIPLE) * MULTIPLE


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` with zero rows appended up to ``padded_rows`` of its rows."""
    rows = x.shape[0]
    return x if rows % MULTIPLE == 0 else F.pad(x, (0, 0, 0, padded_rows(rows) - rows))


class _Float8Linear(torch.autograd.Function):
    """``x @ weight.t()`` with float8 operands: the forward returns the product and the absolute maxima of ``x``
    and the weight; the backward hands the output gradient's to ``sink``. ``scales`` (input, weight, output
    gradient) are used where ``delayed`` is true; otherwise each tensor's own maximum gives its scale."""

    @staticmethod
    def forward(ctx, x, weight, sink, scales, delayed: bool, fast_backward: bool):
        del sink
        x2 = x.reshape(-1, x.shape[-1])
        scale_x = scales[0] if delayed else own_scale(x2, E4M3)
        scale_w = scales[1] if delayed else own_scale(weight, E4M3)
        x8, w8 = cast_saturated(x2, scale_x, E4M3), cast_saturated(weight, scale_w, E4M3)
        inverse_x, inverse_w = scale_x.reciprocal(), scale_w.reciprocal()
        y = torch._scaled_mm(x8, w8.t(), scale_a=inverse_x, scale_b=inverse_w, out_dtype=x.dtype, use_fast_accum=True)
        ctx.save_for_backward(x8, w8, inverse_x, inverse_w, scales[2])
        ctx.delayed, ctx.fast, ctx.shape, ctx.weight_dtype = delayed, fast_backward, x.shape, weight.dtype
        amax = torch.stack([abs_max(x2), abs_max(weight)])
        ctx.mark_non_differentiable(amax)
        return y.view(*x.shape[:-1], -1), amax

    @staticmethod
    def backward(ctx, grad, _):
        x8, w8, inverse_x, inverse_w, scale_g = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])
        if not ctx.delayed:
            scale_g = own_scale(g, E5M2)
        g8, inverse_g = cast_saturated(g, scale_g, E5M2), scale_g.reciprocal()
        grad_x = torch._scaled_mm(g8, w8.t().contiguous().t(), scale_a=inverse_g, scale_b=inverse_w,
                                  out_dtype=grad.dtype, use_fast_accum=ctx.fast)  # fmt: skip
        grad_w = torch._scaled_mm(pad_rows(g8).t().contiguous(), pad_rows(x8).t().contiguous().t(),
                                  scale_a=inverse_g, scale_b=inverse_x, out_dtype=ctx.weight_dtype,
                                  use_fast_accum=ctx.fast)  # fmt: skip
        return grad_x.view(ctx.shape), grad_w, abs_max(g), None, None, None


class DelayedFloat8Linear(torch.nn.Linear):
    """A ``torch.nn.Linear`` whose product runs in float8 with the scales of ``DelayedScales`` (its row ``index``
    there); the weight and bias parameters are the layer's it replaced."""

    def __init__(self, linear: torch.nn.Linear, scales: DelayedScales, index: int, fast_backward: bool = False):
        torch.nn.Module.__init__(self)
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.weight, self.bias = linear.weight, linear.bias
        # the row in ``DelayedScales`` (the forward reads the views below, not the index)
        self.index, self.fast_backward = index, fast_backward
        # plain attributes, not buffers or submodules: views of the one ``DelayedScales`` of every layer, which
        # neither sharding nor ``.to()`` may replace; tensors, not an index, so one compiled block serves all
        self.__dict__.update(
            delayed_scales=scales, scales=scales.scales[index], amax=scales.amax[index], sink=scales.sinks[index]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        calibrated = self.delayed_scales.calibrated
        y, amax = _Float8Linear.apply(x, self.weight, self.sink, self.scales, calibrated, self.fast_backward)
        if self.training and torch.is_grad_enabled():
            self.amax.copy_(torch.maximum(self.amax, amax))
        return y if self.bias is None else y + self.bias

    def extra_repr(self) -> str:
        sizes = f"in_features={self.in_features}, out_features={self.out_features}"
        return f"{sizes}, bias={self.bias is not None}, float8 delayed scaling"


class DelayedScales:
    """Every delayed-scaling layer's absolute-maximum history (input, weight, output gradient) and scales.

    ``history[i, kind, j]``: layer ``i``'s maximum of that kind ``j`` training micro-steps ago (0: the last);
    ``scales[i]``: the scales of its next casts; ``amax[i]``: the input's and weight's maxima of the running
    micro-step, and ``sinks[i].grad`` its output gradient's, both moved into the history by ``roll``.
    """

    def __init__(self, layers: int, history: int, device: torch.device):
        self.history = torch.zeros(layers, 3, history, device=device)
        self.scales = torch.ones(layers, 3, device=device)
        self.amax = torch.zeros(layers, 2, device=device)
        self.sinks = [torch.zeros((), device=device, requires_grad=True) for _ in range(layers)]
        self.limits = torch.tensor(LIMITS, device=device)
        self.calibrated = False
        self.recorded = False

    def _grad_maxima(self) -> torch.Tensor:
        """The output gradients' maxima of the running micro-step, one a layer (0 before its backward)."""
        zero = self.amax.new_zeros(())
        return torch.stack([s.grad.detach() if s.grad is not None else zero for s in self.sinks])

    def roll(self) -> None:
        """Before a training forward: the last micro-step's maxima into the history, and the scales from it."""
        if self.recorded:
            self.history.copy_(self.history.roll(1, dims=2))
            self.history[:, :2, 0] = self.amax
            self.history[:, 2, 0] = self._grad_maxima()
            largest = self.history.amax(dim=2)
            self.scales.copy_(torch.where(largest > 0, self.limits / largest.clamp(min=1e-30), self.scales))
            self.amax.zero_()
            for sink in self.sinks:
                sink.grad = None
            self.calibrated = True
        self.recorded = True

    def pre_hook(self, module: torch.nn.Module, args: Any, kwargs: Any) -> None:
        """The model's forward pre-hook: roll before each training forward."""
        if module.training and torch.is_grad_enabled():
            self.roll()

    def state_dict(self) -> dict[str, Any]:
        """The histories, scales, running maxima and the flags: a resumed run casts as the uninterrupted one."""
        return {
            "history": self.history.cpu(),
            "scales": self.scales.cpu(),
            "amax": self.amax.cpu(),
            "grad_amax": self._grad_maxima().cpu(),
            "calibrated": self.calibrated,
            "recorded": self.recorded,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned (the same layers)."""
        if state["history"].shape != self.history.shape:
            raise ValueError(
                f"fp8 delayed scaling: the checkpoint holds histories of shape {tuple(state['history'].shape)}, "
                f"this run {tuple(self.history.shape)}; resume with the fp8 keys it was saved with"
            )
        for name in ("history", "scales", "amax"):
            getattr(self, name).copy_(state[name])
        for sink, value in zip(self.sinks, state["grad_amax"], strict=True):
            sink.grad = value.to(sink.device) if state["recorded"] else None
        self.calibrated, self.recorded = state["calibrated"], state["recorded"]


def convert_delayed(
    model: torch.nn.Module, names: tuple[str, ...], history: int, device: torch.device, fast_backward: bool = False
) -> DelayedScales:
    """Swap the linear layers ``names`` of ``model`` for ``DelayedFloat8Linear`` sharing one ``DelayedScales`` on
    ``device``, registered as ``model``'s forward pre-hook; return it. ``fast_backward``: the backward's products
    accumulate the fast way too."""
    scales = DelayedScales(len(names), history, device)
    for index, name in enumerate(names):
        parent, _, leaf = name.rpartition(".")
        owner = model.get_submodule(parent)
        setattr(owner, leaf, DelayedFloat8Linear(getattr(owner, leaf), scales, index, fast_backward))
    model.register_forward_pre_hook(scales.pre_hook, with_kwargs=True)
    return scales
