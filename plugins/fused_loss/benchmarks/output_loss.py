"""The output layer and the loss, forward + backward: ktrain's fused_linear_cross_entropy beside Liger's.

On the 1.5B shape's output layer (16,384 tokens, hidden 2048, vocab 128,256, bf16) each variant runs ``--repeats``
forward + backward passes after two warm-ups; printed: milliseconds a pass, TFLOP/s of its three products
(6 x tokens x hidden x vocab), the peak memory above the inputs, and the loss and gradients against the
first row's (Liger's, when installed). The divisor is the count of trained tokens, as a device tensor.

    python plugins/fused_loss/benchmarks/output_loss.py [--chunks 1,2,4,8] [--liger-consts 8,16] [--float8]

``--float8`` adds ``fused_linear_cross_entropy_fp8``'s loss (the three products in float8, the logits' gradient
written in e5m2 by the loss's kernel), on a GPU of compute capability 8.9 or later.

An empty list leaves that side out: ``--chunks '' --liger-consts 1,2,4,8,16`` times Liger's chunk sizes
alone (its ``chunk_mem_const``: chunks whose logits take up to that many times the hidden states' memory).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch

from ktrain_fused_loss.float8_output import linear_cross_entropy_float8
from ktrain_fused_loss.linear_cross_entropy import linear_cross_entropy


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--chunks", default="1,2,4,8")
    parser.add_argument("--liger-consts", default="8,16")
    parser.add_argument("--float8", action="store_true")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(args.vocab, args.hidden, device="cuda") * 0.02).bfloat16().requires_grad_()
    labels = torch.randint(0, args.vocab, (args.tokens,), device="cuda")
    labels[:: args.tokens // 64] = -100
    divisor = (labels != -100).sum().float()
    flops = 6 * args.tokens * args.hidden * args.vocab
    variants: list[tuple[str, Callable[[], torch.Tensor]]] = []
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

        for const in map(int, filter(None, args.liger_consts.split(","))):
            variants.append(
                (
                    f"liger chunk_mem_const {const}",
                    lambda c=const: (
                        liger_fused_linear_cross_entropy(x, w, labels, reduction="sum", chunk_mem_const=c) / divisor
                    ),
                )
            )
    except ImportError:
        print("liger-kernel not installed: ktrain's rows only")
    for chunks in map(int, filter(None, args.chunks.split(","))):
        variants.append((f"ktrain chunks {chunks}", lambda c=chunks: linear_cross_entropy(x, w, labels, divisor, c)))
    if args.float8:
        variants.append(("ktrain float8", lambda: linear_cross_entropy_float8(x, w, labels, divisor)))
    reference = None
    for name, loss_fn in variants:
        for _ in range(2):
            x.grad = w.grad = None
            loss_fn().backward()
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.repeats):
            x.grad = w.grad = None
            loss = loss_fn()
            loss.backward()
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / args.repeats
        extra = (torch.cuda.max_memory_allocated() - base) / 2**30
        got = (float(loss), x.grad.float(), w.grad.float())
        reference = reference or got
        print(
            f"{name:26s} {ms:6.2f} ms  {flops / ms / 1e9:4.0f} TFLOP/s  +{extra:5.2f} GiB peak  "
            f"loss {got[0]:.6f}  max |d grad| hidden {(got[1] - reference[1]).abs().max():.1e} "
            f"weight {(got[2] - reference[2]).abs().max():.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
