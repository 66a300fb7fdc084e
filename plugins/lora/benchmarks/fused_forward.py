"""One QLoRA layer of the 8B Llama shape, peft's forward against the fused one: the operators over the layer's
output and over its input that a forward and backward run, and their time, on this machine's CPU.

The layer is ``gate_proj`` of configs/bench/llama_8b (4096 -> 14336, nf4 with double quantization, bf16
compute), LoRA r 16, alpha 32, under bf16 autocast as a ktrain step runs it. The operators are counted
with ``torch.profiler`` (the same aten operators run on a GPU); only those with an input of the layer's output
or input size are listed: the passes over ``[tokens, out_features]`` and ``[tokens, in_features]`` (the sum of
the input's two gradients) that the fused forward is for.

    python plugins/lora/benchmarks/fused_forward.py [--tokens 2048] [--repeats 5]
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

import bitsandbytes as bnb
import peft
import torch
from torch.profiler import ProfilerActivity, profile

from ktrain_lora.fused_forward import fused_forward_4bit

OPERATORS = (
    "aten::mul",
    "aten::add",
    "aten::add_",
    "aten::clone",
    "aten::copy_",
    "aten::addmm",
    "aten::addmm_",
    "aten::mm",
)
"""The operators counted: element-wise passes and the matrix multiplies (the base's and the adapter's)."""


def _layer(tokens: int) -> tuple[torch.nn.Module, torch.Tensor]:
    """The 4-bit ``gate_proj`` wrapped by peft, ``lora_B`` away from zero, and an input of ``tokens`` rows."""
    torch.manual_seed(0)
    base = torch.nn.Sequential()
    base.add_module(
        "gate_proj",
        bnb.nn.Linear4bit(4096, 14336, bias=False, compute_dtype=torch.bfloat16, quant_type="nf4"),
    )
    base.gate_proj.weight = bnb.nn.Params4bit(
        torch.randn(14336, 4096) * 0.02, requires_grad=False, quant_type="nf4", compress_statistics=True
    )
    base.gate_proj.weight = base.gate_proj.weight._quantize("cpu")
    model = peft.get_peft_model(base, peft.LoraConfig(r=16, lora_alpha=32, target_modules=["gate_proj"]))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(std=0.02)
    return model.base_model.model.gate_proj, torch.randn(tokens, 4096, dtype=torch.bfloat16, requires_grad=True)


def _step(layer: torch.nn.Module, x: torch.Tensor) -> None:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = layer(x)
    out.backward(torch.ones_like(out))


def _measure(layer: torch.nn.Module, x: torch.Tensor, repeats: int) -> tuple[dict[str, int], dict[str, int], float]:
    """Operators over the output's and over the input's size (name -> calls) in one forward and backward, and
    the median seconds."""
    _step(layer, x)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        _step(layer, x)
        times.append(time.perf_counter() - start)
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _step(layer, x)
    calls: tuple[dict[str, int], dict[str, int]] = ({}, {})
    for event in prof.events():
        sizes = {torch.Size(s).numel() for s in event.input_shapes if s}
        for size, counted in zip((x.shape[0] * 14336, x.numel()), calls, strict=True):
            if event.name in OPERATORS and size in sizes:
                counted[event.name] = counted.get(event.name, 0) + 1
    return *calls, statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    layer, x = _layer(args.tokens)
    peft = _measure(layer, x, args.repeats)
    layer.forward = types.MethodType(fused_forward_4bit, layer)
    fused = _measure(layer, x, args.repeats)
    print(f"one 4096 -> 14336 QLoRA layer, {args.tokens} tokens, bf16 autocast, forward + backward on the CPU")
    for name, (outputs, inputs, seconds) in (("peft", peft), ("fused", fused)):
        over_out = ", ".join(f"{op} x{n}" for op, n in sorted(outputs.items()))
        over_in = ", ".join(f"{op} x{n}" for op, n in sorted(inputs.items()))
        print(f"{name:6s} {seconds * 1000:8.1f} ms   over [tokens, 14336]: {over_out}   over [tokens, 4096]: {over_in}")


if __name__ == "__main__":
    main()
