"""What each float8 lever is worth on the 1.5B shape: the blocks' forward + backward, and the output layer's products.

Part 1, the blocks: configs/bench/llama_1p5b's backbone (16 blocks, no output layer) in bf16 on one GPU, each
block's forward compiled as the compile plugin compiles it, 4 x 4096 tokens, forward + backward of the mean square
of the last hidden states (no optimizer: the update is the same in every variant). Each variant converts a fresh
copy of the same weights with torchao's float8 layers:

- ``bf16``: no layer converted;
- ``tensorwise``: the plugin's default plan (q, o, gate, up, down; k and v too small);
- ``+kv``: every block linear layer, k and v too (their input is q's, whose cast inductor can share);
- ``+fast-accum``: the default plan with the backward's products accumulated the fast way too (torchao keeps
  fast accumulation for the forward only);
- ``+pow2``: the default plan with scales rounded down to powers of two;
- ``+kv+fast-accum``: both;
- ``+delayed``: the default plan's layers, cast with scales known before the cast (``DelayedLinear`` here, not
  torchao's: torchao deleted its delayed scaling), so the cast needs no absolute-maximum pass before it; each
  cast tensor's absolute maximum is still computed for the next step, beside the cast (for the output
  gradient, handed to the backward of a sink tensor). Timing only: the scales come from one calibrating step
  and are not updated;
- ``+delayed+fast-accum``: that, with fast accumulation in the backward's products too.

Part 2, the output layer (16,384 tokens x hidden 2048 x vocab 128,256): its three products (logits, the hidden
states' gradient, the weight's gradient) in bf16, and in float8 with tensorwise scales (e4m3 hidden states and
weight, e5m2 logits' gradient) including the compiled casts and the transposed copies ``torch._scaled_mm`` needs;
then the products alone (operands cast beforehand), and the products with the casts of the hidden states and the
weight only: the logits' gradient ``(softmax - onehot) / divisor`` is bounded by ``1 / divisor``, so its scale is
known without an absolute maximum and the loss's kernel could write it in float8 itself (not built: timed as
free). The first bf16 row warms the device up.

Printed for each: ms a step, the device's SM clock and power while timed (NVML), joules a step and the peak
memory. ``ktrain bench`` gives the figures of a whole step; this says where the difference comes from.

    python plugins/fp8/benchmarks/levers.py [--steps 10] [--output-steps 40] [--warmup 3] [--variants bf16,...]
        [--parts output,blocks]
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import functools
import time
from collections.abc import Callable
from pathlib import Path

import torch
import transformers
from torchao.float8 import Float8LinearConfig, convert_to_float8_training

from ktrain.bench.device import DeviceMonitor
from ktrain_fp8.plan import conversion_plan

SHAPE = Path(__file__).resolve().parents[3] / "configs/bench/llama_1p5b"
VARIANTS = ("bf16", "tensorwise", "+kv", "+fast-accum", "+pow2", "+kv+fast-accum", "+delayed", "+delayed+fast-accum")
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def timed(name: str, step: Callable[[], None], steps: int, warmup: int, flops: float) -> None:
    """Run ``step`` ``warmup`` times, then time ``steps`` of it with the device monitored; print one line."""
    device = torch.device("cuda")
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    monitor = DeviceMonitor(device)
    monitor.start()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    ms = (time.perf_counter() - start) / steps * 1e3
    state = monitor.stop()
    power = state.power_w if state else float("nan")
    clock = state.sm_clock_mhz if state else float("nan")
    peak = torch.cuda.max_memory_allocated() / 2**30
    print(
        f"{name:40s} {ms:8.2f} ms  {flops / ms / 1e9:7.0f} TFLOP/s  {clock:6.0f} MHz  {power:4.0f} W  "
        f"{power * ms / 1e3:6.1f} J  {peak:6.1f} GiB",
        flush=True,
    )


def block_variant(name: str) -> tuple[Float8LinearConfig, bool] | None:
    """torchao's config and whether small layers are skipped for ``name``; None for bf16."""
    if name == "bf16":
        return None
    settings = Float8LinearConfig.from_recipe_name("tensorwise")
    if "fast-accum" in name:
        fast = dataclasses.replace(settings.gemm_config_grad_input, use_fast_accum=True)
        settings = dataclasses.replace(settings, gemm_config_grad_input=fast, gemm_config_grad_weight=fast)
    if "pow2" in name:
        settings = dataclasses.replace(settings, round_scales_to_power_of_2=True)
    return settings, "kv" not in name


def _cast(x: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    limit = torch.finfo(dtype).max
    return (x.float() * scale).clamp(-limit, limit).to(dtype)


class _DelayedMatmul(torch.autograd.Function):
    """``x @ weight.t()`` in float8 with the scales given (``scales``: x, weight, output gradient); the forward
    returns the absolute maxima of x and the weight too, the backward hands the output gradient's to ``sink``."""

    @staticmethod
    def forward(ctx, x, weight, sink, scales, fast_backward):
        del sink
        x2 = x.reshape(-1, x.shape[-1])
        x8, w8 = _cast(x2, scales[0], E4M3), _cast(weight, scales[1], E4M3)
        inverse = scales.reciprocal()
        y = torch._scaled_mm(
            x8, w8.t(), scale_a=inverse[0], scale_b=inverse[1], out_dtype=torch.bfloat16, use_fast_accum=True
        )
        ctx.save_for_backward(x8, w8, scales)
        ctx.fast_backward, ctx.shape = fast_backward, x.shape
        amax = torch.stack([x2.abs().amax(), weight.abs().amax()]).float()
        ctx.mark_non_differentiable(amax)
        return y.view(*x.shape[:-1], -1), amax

    @staticmethod
    def backward(ctx, grad, _):
        x8, w8, scales = ctx.saved_tensors
        inverse = scales.reciprocal()
        g = grad.reshape(-1, grad.shape[-1])
        g8 = _cast(g, scales[2], E5M2)
        mm = functools.partial(torch._scaled_mm, out_dtype=torch.bfloat16, use_fast_accum=ctx.fast_backward)
        grad_x = mm(g8, w8.t().contiguous().t(), scale_a=inverse[2], scale_b=inverse[1])
        grad_w = mm(g8.t().contiguous(), x8.t().contiguous().t(), scale_a=inverse[2], scale_b=inverse[0])
        return grad_x.view(ctx.shape), grad_w, g.abs().amax().float(), None, None


class DelayedLinear(torch.nn.Module):
    """A bias-free linear layer in float8 with scales set before the step (``calibrate``), not from the tensor."""

    def __init__(self, linear: torch.nn.Linear, fast_backward: bool):
        super().__init__()
        self.weight, self.fast_backward = linear.weight, fast_backward
        self.sink = torch.nn.Parameter(torch.zeros((), device=linear.weight.device))
        self.register_buffer("scales", torch.ones(3, device=linear.weight.device))
        self.register_buffer("amax", torch.ones(3, device=linear.weight.device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y, amax = _DelayedMatmul.apply(x, self.weight, self.sink, self.scales, self.fast_backward)
        self.amax[:2].copy_(amax)
        return y

    def calibrate(self) -> None:
        """Scales from the absolute maxima of the last step: x's and the weight's, and the output gradient's."""
        self.amax[2] = self.sink.grad if self.sink.grad is not None else 1.0
        limits = torch.tensor([torch.finfo(E4M3).max, torch.finfo(E4M3).max, torch.finfo(E5M2).max])
        self.scales.copy_(limits.to(self.amax.device) / self.amax.clamp(min=1e-12))


def _delayed(model: torch.nn.Module, names: set[str], fast_backward: bool) -> list[DelayedLinear]:
    """Swap the layers ``names`` of ``model`` for ``DelayedLinear``; return them."""
    swapped = []
    for name in names:
        parent, _, leaf = name.rpartition(".")
        layer = DelayedLinear(getattr(model.get_submodule(parent), leaf), fast_backward)
        setattr(model.get_submodule(parent), leaf, layer)
        swapped.append(layer)
    return swapped


def blocks(args: argparse.Namespace) -> None:
    """Part 1: the backbone's forward + backward under each variant."""
    config = transformers.AutoConfig.from_pretrained(SHAPE)
    torch.manual_seed(0)
    with torch.device("cuda"):
        base = transformers.AutoModel.from_config(config, attn_implementation="sdpa", dtype=torch.bfloat16)
    base.config.use_cache = False
    ids = torch.randint(0, config.vocab_size, (4, 4096), device="cuda")
    layer_params = sum(p.numel() for p in base.layers.parameters())
    flops = 6 * ids.numel() * layer_params + 12 * config.num_hidden_layers * config.hidden_size * 4096 * ids.numel()
    per_block = layer_params // config.num_hidden_layers
    print(f"blocks: {config.num_hidden_layers} x {per_block:,} parameters, {ids.numel()} tokens")
    for name in args.variants.split(","):
        torch._dynamo.reset()
        model = copy.deepcopy(base)
        chosen = block_variant(name)
        label = name
        delayed: list[DelayedLinear] = []
        if "delayed" in name:
            names = set(conversion_plan(model, "tensorwise", (), True).converted)
            delayed = _delayed(model, names, "fast-accum" in name)
            label = f"{name} ({len(names)} layers)"
        elif chosen is not None:
            settings, skip_small = chosen
            plan = conversion_plan(model, "tensorwise", (), skip_small)
            names = set(plan.converted)
            convert_to_float8_training(model, module_filter_fn=lambda _, n, names=names: n in names, config=settings)
            label = f"{name} ({len(names)} layers)"
        for layer in model.layers:
            layer.forward = torch.compile(layer.forward)

        def step(model: torch.nn.Module = model) -> None:
            hidden = model(input_ids=ids).last_hidden_state
            hidden.float().square().mean().backward()
            for p in model.parameters():
                p.grad = None

        if delayed:  # one step to calibrate the scales on; then the variant is timed like the others
            hidden = model(input_ids=ids).last_hidden_state
            hidden.float().square().mean().backward()
            for layer in delayed:
                layer.calibrate()
            step()
        timed(label, step, args.steps, args.warmup, flops)
        if delayed:
            print(f"  last block's output gradient scale: {delayed[0].scales[2].item():.3g}", flush=True)
        del model


def to_float8(x: torch.Tensor, dtype: torch.dtype, transpose: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` cast to ``dtype`` with one scale (its absolute maximum to the format's largest value), and the
    inverse scale; ``transpose`` returns the cast of ``x.t()``, laid out row-major."""
    amax = x.abs().amax().float().clamp(min=1e-12)
    scale = torch.finfo(dtype).max / amax
    y = (x.float() * scale).clamp(-torch.finfo(dtype).max, torch.finfo(dtype).max).to(dtype)
    return (y.t().contiguous() if transpose else y), scale.reciprocal()


def output_layer(args: argparse.Namespace) -> None:
    """Part 2: the output layer's three products in bf16, and in float8 with the casts they need."""
    tokens, hidden, vocab = 16384, 2048, 128256
    torch.manual_seed(0)
    h = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
    w = (torch.randn(vocab, hidden, device="cuda") * 0.02).bfloat16()
    g = torch.randn(tokens, vocab, device="cuda", dtype=torch.bfloat16) * 1e-6
    flops = 6 * tokens * hidden * vocab
    cast = torch.compile(to_float8)
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2

    def bf16() -> list[torch.Tensor]:
        return [h @ w.t(), g @ w, g.t() @ h]

    def both(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``x`` in float8 row-major, its inverse scale, and ``x.t()`` in float8 row-major."""
        return *cast(x, dtype, False), cast(x, dtype, True)[0]

    precast = {"h": both(h, e4m3), "w": both(w, e4m3), "g": both(g, e5m2)}

    def fp8(fast_backward: bool, cast_h_w: bool = True, cast_g: bool = True) -> list[torch.Tensor]:
        h8, sh, h8t = both(h, e4m3) if cast_h_w else precast["h"]
        w8, sw, w8t = both(w, e4m3) if cast_h_w else precast["w"]
        g8, sg, g8t = both(g, e5m2) if cast_g else precast["g"]
        mm = functools.partial(torch._scaled_mm, out_dtype=torch.bfloat16)
        logits = mm(h8, w8.t(), scale_a=sh, scale_b=sw, use_fast_accum=True)
        # grad_hidden = g @ w: the weight column-major; grad_weight = g.t() @ h: g.t() row-major, h column-major
        grad_hidden = mm(g8, w8t.t(), scale_a=sg, scale_b=sw, use_fast_accum=fast_backward)
        grad_weight = mm(g8t, h8t.t(), scale_a=sg, scale_b=sh, use_fast_accum=fast_backward)
        return [logits, grad_hidden, grad_weight]

    print(f"output layer: {tokens} tokens x {hidden} x {vocab}, three products")
    timed("output layer bf16 (device warm-up)", bf16, args.output_steps, args.warmup, flops)
    timed("output layer bf16", bf16, args.output_steps, args.warmup, flops)
    timed("output layer fp8 products only", lambda: fp8(False, False, False), args.output_steps, args.warmup, flops)
    timed(
        "output layer fp8, g cast by the loss", lambda: fp8(False, True, False), args.output_steps, args.warmup, flops
    )
    timed("output layer fp8 tensorwise", lambda: fp8(False), args.output_steps, args.warmup, flops)
    timed("output layer fp8 + fast-accum", lambda: fp8(True), args.output_steps, args.warmup, flops)
    for fast in (False, True):
        errors = [((b - a).float().norm() / a.float().norm()).item() for a, b in zip(bf16(), fp8(fast), strict=True)]
        print(
            f"fp8{' + fast-accum' if fast else ''} against bf16, relative error of logits, grad_hidden, "
            f"grad_weight: " + ", ".join(f"{e:.4f}" for e in errors)
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--output-steps", type=int, default=40)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--parts", default="output,blocks")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}")
    if "output" in args.parts:
        output_layer(args)
    if "blocks" in args.parts:
        blocks(args)


if __name__ == "__main__":
    main()
