"""Per-rank parameter and optimizer-state memory under FSDP2, at 1, 2, 4, ... ranks (CPU, gloo).

Each rank shards a Llama model through the plugin's own ``shard`` (FSDP2, transformer blocks then the
root), builds AdamW on the shards, takes one step, and sums the bytes of its local shards: parameters,
and the optimizer's state (exp_avg, exp_avg_sq). The figure to read is each rank's share of the
one-rank total: 1/N, plus the padding FSDP adds to make dim 0 divisible by N.

    python plugins/fsdp/benchmarks/shard_memory.py --ranks 1 2 4
"""

from __future__ import annotations

import argparse
import os
import socket
import types
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

LLAMA = {"hidden_size": 512, "intermediate_size": 1376, "num_hidden_layers": 4, "num_attention_heads": 8,
         "num_key_value_heads": 4, "vocab_size": 8192, "tie_word_embeddings": False}  # fmt: skip
TINY = {**LLAMA, "hidden_size": 64, "intermediate_size": 176, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "vocab_size": 1000}  # fmt: skip


def local_bytes(tensor: torch.Tensor) -> int:
    """Bytes this rank holds of ``tensor`` (its shard when it is a DTensor)."""
    local = tensor.to_local() if hasattr(tensor, "to_local") else tensor
    return local.numel() * local.element_size()


def _rank(rank: int, world: int, port: int, model_config: dict[str, Any], out: Any) -> None:
    import transformers
    from torch.distributed.device_mesh import init_device_mesh

    from ktrain.config.mesh import MeshPlan
    from ktrain.engine import param_groups
    from ktrain_fsdp.options import FsdpOptions
    from ktrain_fsdp.sharding import shard

    os.environ.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**model_config))
    full = sum(p.numel() * p.element_size() for p in model.parameters())
    mesh = init_device_mesh("cpu", (1, world), mesh_dim_names=("dp_replicate", "dp_shard"))
    config = types.SimpleNamespace(weight_decay=0.0, max_grad_norm=1.0)
    plan = MeshPlan(dims={"dp_replicate": 1, "dp_shard": world, "cp": 1, "tp": 1}, world_size=world)
    run = types.SimpleNamespace(
        device_mesh=mesh, mesh=plan, rank=rank, device=torch.device("cpu"), compute_dtype=torch.float32, config=config
    )
    engine = shard(
        model,
        run,
        FsdpOptions(version=2),
        lambda groups: torch.optim.AdamW(groups, lr=1e-3),
        lambda optimizer: torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0),
    )
    assert len(param_groups(engine.model, 0.0)[0]["params"]) > 0
    ids = torch.randint(0, model_config["vocab_size"], (2, 32))
    engine.module(input_ids=ids, labels=ids).loss.backward()
    engine.step()
    params = sum(local_bytes(p) for p in engine.model.parameters())
    optim = sum(local_bytes(v) for s in engine.optimizer.state.values() for v in s.values() if v.dim() > 0)
    out.put((rank, params, optim, full))
    dist.destroy_process_group()


def measure(world: int, model_config: dict[str, Any] = LLAMA) -> list[tuple[int, int, int, int]]:
    """(rank, parameter bytes, optimizer-state bytes, unsharded parameter bytes) of each rank of an FSDP2 run."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    mp.start_processes(_rank, args=(world, port, model_config, out), nprocs=world, start_method="spawn")
    return sorted(out.get() for _ in range(world))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--tiny", action="store_true", help="a 2-layer model of width 64 (for the test)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    print("| ranks | parameters per rank (MiB) | AdamW state per rank (MiB) | share of the whole (1/N) |")
    print("| --- | --- | --- | --- |")
    for world in args.ranks:
        per_rank = measure(world, TINY if args.tiny else LLAMA)
        params = max(p for _, p, _, _ in per_rank)
        optim = max(o for _, _, o, _ in per_rank)
        whole = 3 * per_rank[0][3]  # fp32 parameters, exp_avg and exp_avg_sq of the unsharded model
        share = (params + optim) / whole
        print(f"| {world} | {params / 2**20:.2f} | {optim / 2**20:.2f} | {share:.4f} ({1 / world:.4f}) |")


if __name__ == "__main__":
    main()
