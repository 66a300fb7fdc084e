"""The matrix multiplies of one training step of the 1.5B benchmark shape, each alone, at cuBLAS's speed.

    python tests/benchmarks/gemm_shapes.py [--tokens 16384 --hidden 2048 --kv 512 --intermediate 8192
                                            --vocab 128256 --layers 16] [--blas cublas|cublaslt]
                                           [--sustain SECONDS]

Each linear layer of a Llama block (q, k, v, o, gate, up, down) and the output layer runs three products
a step, in the layouts PyTorch's linear and its backward use: the forward ``x @ W.t()``, the input's
gradient ``dy @ W`` and the weight's gradient ``dy.t() @ x``; and, for comparison, the weight's gradient
the other way round, ``(x.t() @ dy).t()``. Each row is the median of 20 timed calls after 5 warm-up ones
(CUDA events), with TFLOP/s at 2·m·n·k; the last line is the step's sum (blocks times ``--layers``, the
output layer once), to set beside the matrix multiplies of a profiled step (tools/device/trace_summary.py).
``--sustain`` then runs the step's products back to back for that many seconds and prints the rate over
the last half: what the device keeps up when it is hot, where a short burst may run at a higher clock.
"""

from __future__ import annotations

import argparse
import time

import torch
from cuda_timing import time_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (
        ("tokens", 16384),
        ("hidden", 2048),
        ("kv", 512),
        ("intermediate", 8192),
        ("vocab", 128256),
        ("layers", 16),
    ):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--blas", choices=("cublas", "cublaslt"), default=None, help="torch's BLAS library")
    parser.add_argument("--sustain", type=float, default=0.0, help="seconds of the step's products back to back")
    a = parser.parse_args()
    if a.blas:
        torch.backends.cuda.preferred_blas_library(a.blas)
    torch.manual_seed(0)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    h, i = a.hidden, a.intermediate
    linears = {  # name: (out features, in features, how many a step)
        "q": (h, h, a.layers),
        "k": (a.kv, h, a.layers),
        "v": (a.kv, h, a.layers),
        "o": (h, h, a.layers),
        "gate": (i, h, a.layers),
        "up": (i, h, a.layers),
        "down": (h, i, a.layers),
        "output": (a.vocab, h, 1),
    }
    blas = torch.backends.cuda.preferred_blas_library()
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}  blas {blas}")
    total_ms = total_flops = 0.0
    steps = []
    for name, (n, k, count) in linears.items():
        x = torch.randn(a.tokens, k, **bf16) * 0.5
        w = torch.randn(n, k, **bf16) * 0.02
        dy = torch.randn(a.tokens, n, **bf16) * 1e-3
        flops = 2 * a.tokens * n * k
        products = {
            "forward  x @ W.t()": lambda x=x, w=w: x @ w.t(),
            "input    dy @ W": lambda dy=dy, w=w: dy @ w,
            "weight   dy.t() @ x": lambda dy=dy, x=x: dy.t() @ x,
            "weight'  (x.t() @ dy).t()": lambda dy=dy, x=x: (x.t() @ dy).t(),
        }
        for label, fn in products.items():
            ms = time_ms(fn)
            print(f"{name:7s} {n:6d}x{k:<5d} {label:28s} {ms:7.3f} ms  {flops / ms / 1e9:5.0f} TFLOP/s")
            if not label.startswith("weight'"):
                total_ms += ms * count
                total_flops += flops * count
                steps.append((fn, count))
    print(f"step: {total_ms:.1f} ms of matrix multiplies, {total_flops / total_ms / 1e9:.0f} TFLOP/s")
    if a.sustain:
        sustain(steps, total_flops, a.sustain)


def sustain(steps, flops: float, seconds: float) -> None:
    """Run the step's products back to back for ``seconds``; print the rate of the second half."""

    def one_step() -> None:
        for fn, count in steps:
            for _ in range(count):
                fn()

    begin = time.perf_counter()
    half = None
    done = 0
    while time.perf_counter() - begin < seconds or not done:  # at least one step in the second half
        one_step()
        torch.cuda.synchronize()
        if half is None and time.perf_counter() - begin > seconds / 2:
            half, done = time.perf_counter(), 0
        elif half is not None:
            done += 1
    elapsed = time.perf_counter() - half
    rate = done * flops / elapsed / 1e12
    print(f"sustained over the last {elapsed:.1f} s: {elapsed / done * 1e3:.1f} ms a step, {rate:.0f} TFLOP/s")


if __name__ == "__main__":
    main()
