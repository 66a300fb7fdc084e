"""The fused MLP's backward pass alone on a GPU: its Triton kernel at several tile shapes, beside inductor's code.

On the 1.5B shape's MLP (``--tokens`` x 8,192 intermediate features; 16,384 tokens: the bench's 4 x 4096 rows), it
times ``ktrain_fp8.swiglu_triton``'s kernel for each tile (rows x columns, warps) and prints ms, the bytes it
reads and writes (three bf16 tensors in, five float8 ones out) over the time, and whether its outputs are those of
the tile the plugin uses. Then the PyTorch version of the same pass compiled by inductor (``torch.compile``, the
code a compiled block would get without the Triton op), for comparison; and the forward's pass (two bf16
tensors in, one float8 out) beside its compiled PyTorch version. Each figure is the median of the runs
that fit in ``--rep-ms`` milliseconds after warm-up (``triton.testing.do_bench``).

    python plugins/fp8/benchmarks/swiglu_pass.py [--tokens 16384] [--rep-ms 100]
"""

from __future__ import annotations

import argparse

import torch
import triton
import triton.testing

from ktrain_fp8.delayed import E4M3, E5M2, padded_rows
from ktrain_fp8.swiglu import swiglu_backward_float8_reference, swiglu_forward_float8_reference
from ktrain_fp8.swiglu_triton import COLUMNS, ROWS, WARPS, _swiglu_backward_kernel, swiglu_forward_float8

TILES = [(64, 128, 8), (64, 64, 4), (128, 64, 8), (128, 128, 8), (32, 128, 4), (64, 256, 8), (128, 128, 16)]
"""(rows, columns, warps) timed; the first is the plugin's."""


def _launch(grad_h, gate, up, scales, outputs, rows_tile: int, columns_tile: int, warps: int) -> None:
    rows, width = gate.shape
    padded = padded_rows(rows)
    grid = (triton.cdiv(padded, rows_tile), triton.cdiv(width, columns_tile))
    _swiglu_backward_kernel[grid](
        grad_h, gate, up, rows, width, padded, scales, *outputs,
        GRAD_LIMIT=torch.finfo(E5M2).max, HIDDEN_LIMIT=torch.finfo(E4M3).max, ROWS=rows_tile,
        COLUMNS=columns_tile, num_warps=warps,
    )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--features", type=int, default=8192)
    parser.add_argument("--rep-ms", type=int, default=100)
    args = parser.parse_args()
    assert TILES[0] == (ROWS, COLUMNS, WARPS)
    torch.manual_seed(0)
    shape = (args.tokens, args.features)
    grad_h, gate, up = (torch.randn(shape, device="cuda") * size for size in (1e-3, 3.0, 1.0))
    grad_h, gate, up = grad_h.bfloat16(), gate.bfloat16(), up.bfloat16()
    scales = torch.tensor([57344.0 / 0.01, 57344.0 / 0.004, 448.0 / 8], device="cuda")
    padded = padded_rows(args.tokens)
    gigabytes = (3 * 2 * gate.numel() + 2 * gate.numel() + 3 * args.features * padded) / 1e9

    def outputs() -> list[torch.Tensor]:
        rows = [torch.empty(shape, device="cuda", dtype=E5M2) for _ in range(2)]
        transposed = [torch.empty((args.features, padded), device="cuda", dtype=t) for t in (E5M2, E5M2, E4M3)]
        amax = torch.zeros(2, device="cuda")
        return [rows[0], transposed[0], rows[1], transposed[1], transposed[2], amax]

    print(f"torch {torch.__version__}, triton {triton.__version__}, {torch.cuda.get_device_name()}")
    print(f"{args.tokens} tokens x {args.features} features: {gigabytes:.3f} GB read and written")
    first = None
    for rows_tile, columns_tile, warps in TILES:
        out = outputs()
        _launch(grad_h, gate, up, scales, out, rows_tile, columns_tile, warps)
        first = first or out
        pairs = zip(out[:5], first[:5], strict=True)
        same = all(torch.equal(a.view(torch.uint8), b.view(torch.uint8)) for a, b in pairs)
        ms = triton.testing.do_bench(
            lambda r=rows_tile, c=columns_tile, w=warps, o=out: _launch(grad_h, gate, up, scales, o, r, c, w),
            rep=args.rep_ms, return_mode="median",
        )  # fmt: skip
        print(f"tile {rows_tile} x {columns_tile}, {warps} warps: {ms:.3f} ms, {gigabytes / ms * 1e3:.0f} GB/s"
              f"{'' if same else ', outputs differ from the first tile'}")  # fmt: skip
    compiled = torch.compile(swiglu_backward_float8_reference)
    compiled(grad_h, gate, up, scales)
    ms = triton.testing.do_bench(lambda: compiled(grad_h, gate, up, scales), rep=args.rep_ms, return_mode="median")
    print(f"inductor, the PyTorch version compiled: {ms:.3f} ms, {gigabytes / ms * 1e3:.0f} GB/s of the same bytes")
    forward_gigabytes = (2 * 2 + 1) * gate.numel() / 1e9
    reference = torch.compile(swiglu_forward_float8_reference)
    forwards = {"forward kernel": swiglu_forward_float8, "forward, inductor": reference}
    for name, forward in forwards.items():
        forward(gate, up, scales[2:])
        ms = triton.testing.do_bench(lambda f=forward: f(gate, up, scales[2:]), rep=args.rep_ms, return_mode="median")
        print(f"{name}: {ms:.3f} ms, {forward_gigabytes / ms * 1e3:.0f} GB/s of {forward_gigabytes:.3f} GB")


if __name__ == "__main__":
    main()
