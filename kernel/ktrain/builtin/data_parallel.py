"""Default owner of ``sharding``: one process, or DDP over the replicas (and context-parallel ranks)."""

from __future__ import annotations

from typing import Any

from torch.nn.parallel import DistributedDataParallel

from ktrain import hookimpl
from ktrain.engine import DataParallelEngine, Engine, param_groups
from ktrain.run.distributed import submesh


class DataParallel:
    """``ktrain_shard`` for plain data parallelism: the model moved to the device, wrapped in DDP when world > 1."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_shard(self, model: Any, run: Any, build_optimizer: Any, build_lr_scheduler: Any) -> Engine:
        model.to(run.device)
        module = model
        if run.mesh.gradient_ranks > 1:  # replicas, and context-parallel ranks (same weights, other tokens)
            ids = [run.device.index] if run.device.type == "cuda" else None
            dims = tuple(d for d in ("dp_replicate", "cp") if run.mesh.dims[d] > 1)
            group = submesh(run.device_mesh, dims).get_group() if run.mesh.copies > 1 else None
            module = DistributedDataParallel(model, device_ids=ids, process_group=group)
        optimizer = build_optimizer(param_groups(model, self.config.weight_decay))
        return DataParallelEngine(module, model, optimizer, build_lr_scheduler(optimizer), self.config.max_grad_norm)
