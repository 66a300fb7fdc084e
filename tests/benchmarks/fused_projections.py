"""Forward + backward time of a Llama block's input projections, one matrix multiply each or fused.

    python tests/benchmarks/fused_projections.py [--tokens 16384 --hidden 2048 --heads 32 --kv-heads 8
                                                  --head-dim 64 --intermediate 8192]

On the 1.5B benchmark's shape, bf16 on CUDA: q, k and v from the attention's normed input, gate and up
from the MLP's, as transformers computes them (one ``F.linear`` each, so the input's gradient is the sum
of three and two products) against one product over the weights concatenated, either stored so
(``stored``) or concatenated at each call (``cat``, which keeps the checkpoint's separate weights). Each
row is the median of 20 timed rounds after 5 warm-up ones (CUDA events); TFLOP/s counts 6 FLOPs a weight
a token.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from cuda_timing import time_ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (
        ("tokens", 16384),
        ("hidden", 2048),
        ("heads", 32),
        ("kv-heads", 8),
        ("head-dim", 64),
        ("intermediate", 8192),
    ):
        parser.add_argument(f"--{name}", type=int, default=default)
    a = parser.parse_args()
    torch.manual_seed(0)
    bf16 = {"device": "cuda", "dtype": torch.bfloat16}
    x = torch.randn(a.tokens, a.hidden, **bf16, requires_grad=True)
    groups = {
        "attention q, k, v": (a.heads * a.head_dim, a.kv_heads * a.head_dim, a.kv_heads * a.head_dim),
        "mlp gate, up": (a.intermediate, a.intermediate),
    }
    for group, outs in groups.items():
        bench_group(group, x, outs)


def bench_group(group: str, x: torch.Tensor, outs: tuple[int, ...]) -> None:
    """Print the three ways of computing ``x``'s projections to ``outs`` features, forward and backward."""
    bf16 = {"device": x.device, "dtype": x.dtype}
    weights = [(torch.randn(n, x.shape[1], **bf16) * 0.02).requires_grad_() for n in outs]
    stored = torch.cat([w.detach() for w in weights]).requires_grad_()
    grads = [torch.randn(x.shape[0], n, **bf16) for n in outs]
    fused_grad = torch.cat(grads, dim=1)

    def clear():  # as after zero_grad(set_to_none=True): the backward writes the gradients, adds nothing
        for tensor in (x, stored, *weights):
            tensor.grad = None

    def separate():
        clear()
        torch.autograd.backward([F.linear(x, w) for w in weights], grads)

    def fused_stored():
        clear()
        F.linear(x, stored).backward(fused_grad)

    def fused_cat():
        clear()
        F.linear(x, torch.cat(weights)).backward(fused_grad)

    flops = 6 * x.shape[0] * x.shape[1] * sum(outs)
    for name, fn in (("separate", separate), ("stored", fused_stored), ("cat", fused_cat)):
        ms = time_ms(fn)
        print(f"{group:18s} {name:9s} {ms:7.3f} ms  {flops / ms / 1e9:6.0f} TFLOP/s", flush=True)


if __name__ == "__main__":
    main()
