"""The bandwidth of ``adamw_fp32_master``'s GPU update (``ktrain.builtin.master_weights_triton``) on the weights of
the 1.5B Llama shape in configs/bench, at its block size and at others: how far the update is from the device's
memory bandwidth, and whether another launch shape moves its 28 bytes a parameter faster.

    python tools/device/master_update_bandwidth.py [--repeats 10]

Prints, for each (BLOCK, num_warps), the milliseconds of one update of every weight and the bytes moved per
second (28 bytes a parameter: the bf16 gradient, the fp32 master and moments read; the master, moments and bf16
weight written).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton

from ktrain.builtin import master_weights_triton

CONFIG = Path(__file__).resolve().parents[2] / "configs/bench/llama_1p5b/config.json"


def _shapes() -> list[tuple[int, ...]]:
    """The weights of the 1.5B Llama shape (embeddings, 16 blocks' projections, output layer)."""
    c = json.loads(CONFIG.read_text())
    hidden, inter, heads, kv, head_dim = (
        c["hidden_size"], c["intermediate_size"], c["num_attention_heads"], c["num_key_value_heads"], c["head_dim"]
    )  # fmt: skip
    block = [(heads * head_dim, hidden), (kv * head_dim, hidden), (kv * head_dim, hidden), (hidden, heads * head_dim)]
    block += [(inter, hidden), (inter, hidden), (hidden, inter)]
    return [(c["vocab_size"], hidden)] + block * c["num_hidden_layers"] + [(c["vocab_size"], hidden)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=10)
    args = parser.parse_args()
    rows = []
    for shape in _shapes():
        weight = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        master = weight.float()
        moments = torch.zeros_like(master), torch.zeros_like(master)
        rows.append((weight, master, torch.randn_like(weight) * 1e-3, *moments))
    params = sum(r[0].numel() for r in rows)
    step = torch.ones((), device="cuda")
    group = {"lr": 1e-5, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.0}
    name = torch.cuda.get_device_name()
    print(f"{name}: {len(rows)} weights, {params:,} parameters, {28 * params / 1e9:.1f} GB a step")

    def run(block: int, warps: int) -> float:
        beta1, beta2 = group["betas"]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(args.repeats + 2):
            if i == 2:
                start.record()
            for weight, master, grad, m, v in rows:
                n = weight.numel()
                master_weights_triton._adamw_master_kernel[(triton.cdiv(n, block),)](
                    weight, master, grad, m, v, step, step, n, 1e-5, beta1, beta2, 1e-8, 0.0,
                    SCALED=False, BLOCK=block, num_warps=warps,
                )  # fmt: skip
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / args.repeats

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for i in range(args.repeats + 2):
        if i == 2:
            start.record()
        for row in rows:
            master_weights_triton.update(*row, step, None, group)
    end.record()
    torch.cuda.synchronize()
    ms = start.elapsed_time(end) / args.repeats
    print(f"update() as shipped (BLOCK {master_weights_triton.BLOCK}): {ms:.2f} ms, {28 * params / ms / 1e9:.2f} TB/s")
    for block in (1024, 2048, 4096, 8192):
        for warps in (4, 8, 16):
            ms = run(block, warps)
            print(f"BLOCK {block:5d} num_warps {warps:2d}: {ms:.2f} ms, {28 * params / ms / 1e9:.2f} TB/s")


if __name__ == "__main__":
    main()
