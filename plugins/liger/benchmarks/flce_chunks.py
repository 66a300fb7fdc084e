"""Liger's fused linear cross entropy at several chunk sizes: milliseconds and extra memory per forward+backward.

Liger cuts the tokens into chunks whose logits take about ``chunk_mem_const`` times the hidden states'
memory (default 1). On the issue-9 shape (16,384 tokens, hidden 2048, vocab 128,256) the default gives
chunks of 512 tokens, 32 of them, and every chunk adds its share into the whole bf16 weight gradient.
This times one forward + backward of the output layer and the loss per ``chunk_mem_const`` on a GPU:

    python plugins/liger/benchmarks/flce_chunks.py [--tokens 16384 --hidden 2048 --vocab 128256]
"""

from __future__ import annotations

import argparse

import torch
from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy


def _step(x: torch.Tensor, w: torch.Tensor, target: torch.Tensor, const: int) -> torch.Tensor:
    loss = liger_fused_linear_cross_entropy(x, w, target, reduction="sum", chunk_mem_const=const)
    loss.backward()
    return loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--vocab", type=int, default=128256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--consts", default="1,2,4,8,16")
    args = parser.parse_args()
    torch.manual_seed(0)
    x = torch.randn(args.tokens, args.hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(args.vocab, args.hidden, device="cuda") * 0.02).bfloat16().requires_grad_()
    target = torch.randint(0, args.vocab, (args.tokens,), device="cuda")
    flops = 6 * args.tokens * args.hidden * args.vocab
    reference = None
    for const in map(int, args.consts.split(",")):
        for _ in range(2):
            loss = _step(x, w, target, const)
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(args.repeats):
            x.grad = w.grad = None
            loss = _step(x, w, target, const)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / args.repeats
        extra = (torch.cuda.max_memory_allocated() - base) / 2**30
        reference = float(loss.detach()) if reference is None else reference
        print(
            f"chunk_mem_const {const:>2}: {ms:6.2f} ms  {flops / ms / 1e9:5.0f} TFLOP/s  "
            f"+{extra:.2f} GiB peak  loss rel diff {abs(float(loss.detach()) - reference) / reference:.1e}",
            flush=True,
        )


if __name__ == "__main__":
    main()
