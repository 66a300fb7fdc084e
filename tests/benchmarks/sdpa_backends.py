"""Forward + backward time of PyTorch SDPA's CUDA backends on the 1.5B benchmark's attention shape.

    python tests/benchmarks/sdpa_backends.py [--batch 4 --seq 4096 --heads 32 --kv-heads 8 --head-dim 64]

Causal, bf16, grouped-query K/V passed with ``enable_gqa`` as transformers' SDPA path passes them; each
backend alone through ``torch.nn.attention.sdpa_kernel``; TFLOP/s counts 4·b·h·s²·d·(1 + 2.5)/2 (causal
forward and backward). A backend that cannot take the shape says why.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for name, default in (("batch", 4), ("seq", 4096), ("heads", 32), ("kv-heads", 8), ("head-dim", 64)):
        parser.add_argument(f"--{name}", type=int, default=default)
    a = parser.parse_args()
    q = torch.randn(a.batch, a.heads, a.seq, a.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k = torch.randn(a.batch, a.kv_heads, a.seq, a.head_dim, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    v = torch.randn_like(k, requires_grad=True)
    flops = 4 * a.batch * a.heads * a.seq**2 * a.head_dim * 3.5 / 2
    for backend in (SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION):
        for gqa in (True, False):
            kk, vv = (
                (k, v)
                if gqa
                else (k.repeat_interleave(a.heads // a.kv_heads, 1), v.repeat_interleave(a.heads // a.kv_heads, 1))
            )
            try:
                with sdpa_kernel([backend]):
                    for _ in range(3):
                        F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa).sum().backward()
                    torch.cuda.synchronize()
                    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                    start.record()
                    for _ in range(10):
                        F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=gqa).sum().backward()
                    end.record()
                    torch.cuda.synchronize()
                ms = start.elapsed_time(end) / 10
                print(f"{backend.name:22s} gqa={gqa!s:5s} {ms:7.2f} ms  {flops / ms / 1e9:6.0f} TFLOP/s", flush=True)
            except RuntimeError as e:
                print(f"{backend.name:22s} gqa={gqa!s:5s} cannot: {str(e).splitlines()[0][:120]}", flush=True)


if __name__ == "__main__":
    main()
