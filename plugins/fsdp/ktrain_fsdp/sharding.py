"""``ktrain_shard`` under FSDP: the data-parallel mesh, the units to shard, then FSDP2 or FSDP1, then the optimizer.

The mesh is the run's ``dp_shard`` dimension (with ``cp`` folded in), or ``dp_replicate`` x ``dp_shard``
for HSDP (shard inside a replica, replicate across). A one-process run gets a process group of one
rank, so that it takes the same code path as a sharded one.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from ktrain.builtin.checkpointing import Recompute, apply_checkpointing
from ktrain.config.report import ConfigError
from ktrain.engine import param_groups
from ktrain.run.distributed import submesh
from ktrain_fsdp.engine import FsdpEngine
from ktrain_fsdp.options import FsdpOptions, layer_key


def data_parallel_mesh(run: Any, options: FsdpOptions) -> DeviceMesh:
    """The mesh FSDP shards over: 1-D ``dp_shard``, or 2-D ``(dp_replicate, dp_shard)`` for HSDP.

    Under context parallelism ``dp_shard`` and ``cp`` are flattened into one dimension (torchtitan's
    ``dp_shard_cp``): gradients are averaged over the sequence shards as over the data shards.
    """
    mesh = run.device_mesh
    if mesh is None:
        if not dist.is_initialized():
            backend = "nccl" if run.device.type == "cuda" else "gloo"
            dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
        mesh = init_device_mesh(run.device.type, (1, 1), mesh_dim_names=("dp_replicate", "dp_shard"))
    shard = "dp_shard"
    if run.mesh.dims["cp"] > 1:  # context-parallel ranks hold the same weights: shard over them too
        shard = submesh(mesh, ("dp_shard", "cp")).mesh_dim_names[0]
    if options.sharding_strategy == "HYBRID_SHARD":
        return mesh["dp_replicate", shard]
    return mesh[shard]


def layer_classes(model: torch.nn.Module, options: FsdpOptions) -> tuple[type, ...]:
    """The transformer block classes to wrap: as written, or the model's ``_no_split_modules``."""
    names = options.layer_classes or tuple(getattr(model, "_no_split_modules", None) or ())
    present = {type(m).__name__: type(m) for m in model.modules()}
    if not names:
        raise ConfigError.single(
            layer_key(options),
            f"{type(model).__name__} does not name its transformer block; write it (the model's classes: "
            f"{', '.join(sorted(present))})",
        )
    missing = [name for name in names if name not in present]
    if missing:
        raise ConfigError.single(
            layer_key(options),
            f"{type(model).__name__} has no {', '.join(missing)}; the classes it has: {', '.join(sorted(present))}",
        )
    return tuple(present[name] for name in names)


def recompute(options: FsdpOptions) -> Recompute:
    """``activation_checkpointing``'s choices for the kernel's ``apply_checkpointing``: the share of the blocks
    and the scope (block or MLP) that ``fsdp_config`` writes."""
    return Recompute(
        fraction=options.activation_checkpointing_fraction,
        scope=options.activation_checkpointing_scope,
        key="fsdp_config.activation_checkpointing_scope",
    )


def shard(model: Any, run: Any, options: FsdpOptions, build_optimizer: Any, build_lr_scheduler: Any) -> FsdpEngine:
    """Shard ``model`` as ``options`` say and return the engine the loop drives."""
    mesh = data_parallel_mesh(run, options)
    classes = layer_classes(model, options) if options.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" else ()
    if options.version == 2:
        from ktrain_fsdp.fsdp2 import apply_fsdp2

        if options.activation_checkpointing:
            apply_checkpointing(model, recompute(options), classes)
        apply_fsdp2(model, run, options, mesh, classes)
        module = model
    else:
        from ktrain_fsdp.fsdp1 import apply_fsdp1

        module = apply_fsdp1(model, run, options, mesh, classes)
        if options.activation_checkpointing:
            apply_checkpointing(module, Recompute(key="fsdp_config.activation_checkpointing"), classes)
    optimizer = build_optimizer(param_groups(module, run.config.weight_decay))
    return FsdpEngine(
        module,
        module,
        optimizer,
        build_lr_scheduler(optimizer),
        run.config.max_grad_norm,
        version=options.version,
        device=run.device,
    )


def shard_frozen(module: Any, run: Any, options: FsdpOptions) -> Any:
    """A frozen module (a preference run's reference model) sharded as the policy is: FSDP2's ``fully_shard`` of
    the same units and the root over the same mesh, with the same mixed-precision and offload policies; every
    unit, the root too, gives its parameters back after its forward (no backward follows). Under
    ``cpu_ram_efficient_loading`` rank 0's copy fills the other ranks' shards, as for the policy. FSDP1
    keeps it whole on every rank (None), under ``cpu_ram_efficient_loading`` rank 0's copy broadcast to the
    others (theirs is empty)."""
    if options.version != 2:
        if not options.cpu_ram_efficient_loading:
            return None
        from ktrain_fsdp.fsdp1 import broadcast_from_rank0

        if not any(p.is_meta for p in module.parameters()):  # rank 0: its copy, on the device the others take
            module.to(run.device)
        broadcast_from_rank0(module, run.device)
        return module
    from ktrain_fsdp.fsdp2 import apply_fsdp2

    mesh = data_parallel_mesh(run, options)
    classes = layer_classes(module, options) if options.auto_wrap_policy == "TRANSFORMER_BASED_WRAP" else ()
    apply_fsdp2(module, run, attrs.evolve(options, reshard_after_forward=True), mesh, classes)
    module.requires_grad_(False)
    return module.eval()
