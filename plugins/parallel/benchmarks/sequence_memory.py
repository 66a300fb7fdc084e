"""Activation memory per rank for long sequences: one rank at S and 2S, and 2S split over 2 ranks.

    python plugins/parallel/benchmarks/sequence_memory.py [--length 2048]

Activation memory is measured as the bytes of the tensors autograd saves for backward in one forward
(each storage counted once), on the largest rank: what a GPU must hold between forward and backward.
A Llama-shaped model (hidden 256, 4 layers, 8 heads, 2 KV heads, vocabulary 4096) with random
weights, one row of random tokens, CPU ranks over gloo; the layouts are the plugin's own
(``split_batch`` and the split-sequence attention), without the rest of the training loop.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

import torch
import torch.distributed as dist

SHAPE = {
    "hidden_size": 256,
    "intermediate_size": 1024,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 2,
    "vocab_size": 4096,
    "max_position_embeddings": 65536,
}


def saved_bytes(run) -> int:
    """Bytes of the distinct storages autograd saves for backward while ``run()`` computes."""
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        seen[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        run()
    return sum(seen.values())


def rank_main(length: int, mode: str) -> None:
    import transformers

    from ktrain_parallel import attention
    from ktrain_parallel.sequence import split_batch

    ranks = int(os.environ.get("WORLD_SIZE", "1"))
    if ranks > 1:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if ranks > 1 else 0
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**SHAPE))
    attention.install(model)
    state = attention.STATE
    state.mode, state.ranks, state.group = mode, ranks, dist.group.WORLD if ranks > 1 else None
    ids = torch.randint(0, SHAPE["vocab_size"], (1, length))
    part, state.split = split_batch({"input_ids": ids, "labels": ids}, ranks, rank, 2 * ranks, 0)

    def forward() -> None:
        model(**part).loss.backward()

    mine = torch.tensor([saved_bytes(forward)], dtype=torch.float64)
    if ranks > 1:
        dist.all_reduce(mine, op=dist.ReduceOp.MAX)
    if rank == 0:
        print(f"RESULT {mine.item() / 2**20:.1f}", flush=True)
    if ranks > 1:
        dist.destroy_process_group()


def measure(length: int, ranks: int, mode: str) -> float:
    """Run one layout in fresh processes; the largest rank's activation MiB."""
    args = [__file__, "--rank", "--length", str(length), "--mode", mode]
    if ranks > 1:
        args = ["-m", "torch.distributed.run", "--nproc-per-node", str(ranks), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, check=True).stdout
    return float(next(line.split()[1] for line in out.splitlines() if line.startswith("RESULT")))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--length", type=int, default=2048, help="S: the one-rank sequence length")
    parser.add_argument("--rank", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="gather", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.rank:
        rank_main(args.length, args.mode)
        return
    s = args.length
    rows = [
        (f"1 rank, S = {s}", measure(s, 1, "gather")),
        (f"1 rank, 2S = {2 * s}", measure(2 * s, 1, "gather")),
        (f"context parallel 2, 2S = {2 * s}", measure(2 * s, 2, "gather")),
        (f"Ulysses sequence parallel 2, 2S = {2 * s}", measure(2 * s, 2, "ulysses")),
    ]
    print("| layout | activation MiB per rank (largest rank) |\n| --- | --- |")
    for name, mib in rows:
        print(f"| {name} | {mib:.1f} |")


if __name__ == "__main__":
    main()
