"""Forward + backward time of PyTorch SDPA's CUDA backends on the 1.5B benchmark's attention shape.

    python tests/benchmarks/sdpa_backends.py [--batch 4 --seq 4096 --heads 32 --kv-heads 8 --head-dim 64]
                                             [--layout bhsd|bshd|bshd-copy]

Causal, bf16, grouped-query K/V passed with ``enable_gqa`` as transformers' SDPA path passes them; each
backend alone through ``torch.nn.attention.sdpa_kernel``, then FlexAttention compiled with a causal block
mask; TFLOP/s counts 4·b·h·s²·d·(1 + 2.5)/2 (causal forward and backward; the output's gradient is random
and contiguous). A backend that cannot take the shape says why. ``--layout bshd`` hands SDPA what a
transformers attention layer hands it: q/k/v are transposed views of (batch, seq, heads, dim) projections,
and the output is transposed back and made contiguous; ``bshd-copy`` makes q/k/v contiguous first.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("batch", 4), ("seq", 4096), ("heads", 32), ("kv-heads", 8), ("head-dim", 64)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--layout", choices=("bhsd", "bshd", "bshd-copy"), default="bhsd")
    a = parser.parse_args()
    bshd = a.layout != "bhsd"

    def leaf(heads: int) -> torch.Tensor:
        shape = (a.batch, a.seq, heads, a.head_dim) if bshd else (a.batch, heads, a.seq, a.head_dim)
        t = torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        return t.transpose(1, 2) if bshd else t

    def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
        if a.layout == "bshd-copy":
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        return out.transpose(1, 2).contiguous() if bshd else out

    q, k, v = leaf(a.heads), leaf(a.kv_heads), leaf(a.kv_heads)
    grad = torch.randn_like(attend(q, k, v, True))  # a contiguous gradient of the output, as a model's is
    flops = 4 * a.batch * a.heads * a.seq**2 * a.head_dim * 3.5 / 2

    def report(name: str, gqa: bool, step: Callable[[], None]) -> None:
        try:
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                step()
            end.record()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end) / 10
            print(f"{a.layout:9s} {name:22s} gqa={gqa!s:5s} {ms:7.2f} ms  {flops / ms / 1e9:6.0f} TFLOP/s", flush=True)
        except RuntimeError as e:
            print(f"{a.layout:9s} {name:22s} gqa={gqa!s:5s} cannot: {str(e).splitlines()[0][:120]}", flush=True)

    def sdpa_step(backend: SDPBackend, kk: torch.Tensor, vv: torch.Tensor, gqa: bool) -> Callable[[], None]:
        def step() -> None:
            with sdpa_kernel([backend]):
                attend(q, kk, vv, gqa).backward(grad)

        return step

    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        for gqa in (True, False):
            kk, vv = (
                (k, v)
                if gqa
                else (k.repeat_interleave(a.heads // a.kv_heads, 1), v.repeat_interleave(a.heads // a.kv_heads, 1))
            )
            report(backend.name, gqa, sdpa_step(backend, kk, vv, gqa))
    # FlexAttention, compiled (its Triton kernels), with a causal block mask: skips the masked-out blocks
    mask = create_block_mask(lambda b, h, i, j: i >= j, None, None, a.seq, a.seq, device="cuda")
    flex = torch.compile(flex_attention)

    def flex_step() -> None:
        out = flex(q, k, v, block_mask=mask, enable_gqa=True)
        (out.transpose(1, 2).contiguous() if bshd else out).backward(grad)

    report("FLEX_ATTENTION", True, flex_step)


if __name__ == "__main__":
    main()
