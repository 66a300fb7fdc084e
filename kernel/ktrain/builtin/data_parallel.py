"""Default owner of ``sharding``: one process, or DDP over every rank when no sharding plugin is active."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from ktrain import hookimpl
from ktrain.engine import Engine, param_groups


class DataParallelEngine(Engine):
    """The kernel owns the step; DDP skips the gradient all-reduce on all but the last micro-batch."""

    @contextlib.contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        if last or not isinstance(self.module, DistributedDataParallel):
            yield
        else:
            with self.module.no_sync():
                yield


class DataParallel:
    """``ktrain_shard`` for plain data parallelism: the model moved to the device, wrapped in DDP when world > 1."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_shard(self, model: Any, run: Any, build_optimizer: Any, build_lr_scheduler: Any) -> Engine:
        model.to(run.device)
        module = model
        if run.mesh.dp_size > 1:
            ids = [run.device.index] if run.device.type == "cuda" else None
            group = run.device_mesh["dp_replicate"].get_group() if run.world_size > run.mesh.dp_size else None
            module = DistributedDataParallel(model, device_ids=ids, process_group=group)
        optimizer = build_optimizer(param_groups(model, self.config.weight_decay))
        return DataParallelEngine(module, model, optimizer, build_lr_scheduler(optimizer), self.config.max_grad_norm)
