"""bitsandbytes' ``dequantize_4bit`` against the one-kernel dequantization (``ktrain_lora.dequantize_triton``) on a
GPU: the host's time to launch one and the device's time to run it, for the 8B Llama shape's 4-bit weights (nf4,
double quantization, bf16), and whether the two agree to the bit.

    python plugins/lora/benchmarks/dequantize.py [--repeats 200]

The host's time is the wall time of launching ``--repeats`` dequantizations of one weight without waiting for
the device, divided by their number (the device queue holds them); the device's is CUDA events around as many.
"""

from __future__ import annotations

import argparse
import time

import bitsandbytes.functional as F
import torch

from ktrain_lora.dequantize_triton import dequantize

SHAPES = {"q_proj": (4096, 4096), "k_proj": (1024, 4096), "gate_proj": (14336, 4096), "down_proj": (4096, 14336)}
"""Weights of configs/bench/llama_8b (out, in)."""


def _time(fn: object, repeats: int) -> tuple[float, float]:
    """Microseconds a call: launching it on the host, running it on the device."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    host = (time.perf_counter() - start) / repeats
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(repeats):
        fn()
    end.record()
    torch.cuda.synchronize()
    return host * 1e6, begin.elapsed_time(end) * 1e3 / repeats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=200)
    args = parser.parse_args()
    torch.manual_seed(0)
    print(f"{torch.cuda.get_device_name()}: nf4, double quantization, bf16; microseconds a dequantization")
    for name, shape in SHAPES.items():
        weight = torch.randn(shape, device="cuda", dtype=torch.bfloat16) * 0.02
        packed, state = F.quantize_4bit(
            weight, blocksize=64, compress_statistics=True, quant_type="nf4", quant_storage=torch.bfloat16
        )
        same = torch.equal(dequantize(packed, state), F.dequantize_4bit(packed, state))
        bnb_host, bnb_device = _time(lambda p=packed, s=state: F.dequantize_4bit(p, s), args.repeats)
        one_host, one_device = _time(lambda p=packed, s=state: dequantize(p, s), args.repeats)
        print(
            f"{name:10s} {shape}: bitsandbytes host {bnb_host:6.1f} device {bnb_device:6.1f}; "
            f"one kernel host {one_host:6.1f} device {one_device:6.1f}; equal: {same}"
        )


if __name__ == "__main__":
    main()
