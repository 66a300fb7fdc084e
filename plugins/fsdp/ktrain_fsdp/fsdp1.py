"""FSDP1: ``FullyShardedDataParallel`` with Axolotl's ``fsdp_*`` options.

HYBRID_SHARD shards over ``dp_shard`` and replicates over ``dp_replicate`` (the run's 2-D mesh).
Under ``cpu_ram_efficient_loading`` the ranks other than 0 hold a meta model, materialised empty at
wrap time and filled by ``sync_module_states``' broadcast of rank 0's weights.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import (
    BackwardPrefetch,
    CPUOffload,
    MixedPrecision,
    ShardingStrategy,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy, transformer_auto_wrap_policy

from ktrain_fsdp.options import FsdpOptions


def mixed_precision(compute_dtype: torch.dtype) -> MixedPrecision | None:
    """Compute-dtype parameters, fp32 gradient reductions and buffers; None in fp32."""
    if compute_dtype == torch.float32:
        return None
    return MixedPrecision(param_dtype=compute_dtype, reduce_dtype=torch.float32, buffer_dtype=torch.float32)


def wrap_policy(options: FsdpOptions, classes: tuple[type, ...]) -> Any:
    """FSDP1's auto-wrap policy for ``auto_wrap_policy`` (None: the root is the only unit)."""
    if options.auto_wrap_policy == "TRANSFORMER_BASED_WRAP":
        return functools.partial(transformer_auto_wrap_policy, transformer_layer_cls=set(classes))
    if options.auto_wrap_policy == "SIZE_BASED_WRAP":
        return functools.partial(size_based_auto_wrap_policy, min_num_params=options.min_num_params)
    return None


@torch.no_grad()
def broadcast_from_rank0(model: torch.nn.Module, device: torch.device) -> None:
    """``sync_module_states`` on CPU, where FSDP1's own needs an accelerator: rank 0's weights to every rank."""
    if any(p.is_meta for p in model.parameters()):
        model.to_empty(device=device)
    for tensor in (*model.parameters(), *model.buffers()):
        dist.broadcast(tensor, src=0)


def apply_fsdp1(
    model: torch.nn.Module, run: Any, options: FsdpOptions, mesh: DeviceMesh, classes: tuple[type, ...]
) -> FSDP:
    """Wrap ``model`` in FSDP1 over ``mesh``; return the root wrapper."""
    strategy = ShardingStrategy[options.sharding_strategy]
    if strategy != ShardingStrategy.HYBRID_SHARD:
        where: dict[str, Any] = {"process_group": mesh.get_group()}
    elif mesh.size(1) == 1:
        # FSDP1 turns a hybrid of one-rank shards into NO_SHARD over the (one-rank) shard group, which
        # would never average gradients across replicas: replicate over dp_replicate explicitly.
        strategy, where = ShardingStrategy.NO_SHARD, {"process_group": mesh.get_group(0)}
    else:
        where = {"device_mesh": mesh}
    on_meta = any(p.is_meta for p in model.parameters())
    device = run.device
    on_cpu = device.type == "cpu"
    if on_cpu and (options.sync_module_states or on_meta):
        broadcast_from_rank0(model, device)

    def materialise(module: torch.nn.Module) -> None:
        module.to_empty(device=device, recurse=False)

    return FSDP(
        model,
        sharding_strategy=strategy,
        auto_wrap_policy=wrap_policy(options, classes),
        cpu_offload=CPUOffload(offload_params=options.offload_params),
        mixed_precision=mixed_precision(run.compute_dtype),
        backward_prefetch=None
        if options.backward_prefetch == "NO_PREFETCH"
        else BackwardPrefetch[options.backward_prefetch],
        forward_prefetch=options.forward_prefetch,
        limit_all_gathers=options.limit_all_gathers,
        use_orig_params=options.use_orig_params,
        sync_module_states=options.sync_module_states and not on_cpu,
        device_id=device,
        param_init_fn=materialise if on_meta and not on_cpu else None,
        **where,
    )
