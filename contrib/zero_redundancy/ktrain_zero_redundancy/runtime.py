"""The runtime object of a ``zero_redundancy: true`` run: sharding, its checkpoints, and a memory metric."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from torch.nn.parallel import DistributedDataParallel

from ktrain import hookimpl
from ktrain.engine import param_groups
from ktrain_zero_redundancy import checkpoint
from ktrain_zero_redundancy.engine import ZeroRedundancyEngine, sharded_optimizer


class ZeroRedundancy:
    """Owns ``sharding`` (DDP + ZeroRedundancyOptimizer) and ``checkpoint_format`` (``zero-redundancy``)."""

    def __init__(self, config: Any):
        self.config = config
        self.engine: ZeroRedundancyEngine | None = None

    @hookimpl
    def ktrain_shard(self, model: Any, run: Any, build_optimizer: Any, build_lr_scheduler: Any) -> ZeroRedundancyEngine:
        """Every rank is data parallel (checked with the config): DDP and ZeRO over the default process group."""
        model.to(run.device)
        groups = param_groups(model, self.config.weight_decay)
        if run.world_size > 1:
            ids = [run.device.index] if run.device.type == "cuda" else None
            module = DistributedDataParallel(model, device_ids=ids)
            optimizer = sharded_optimizer(groups, build_optimizer, self.config.zero_redundancy_bucket_view)
        else:  # one rank: nothing to shard
            module, optimizer = model, build_optimizer(groups)
        scheduler = build_lr_scheduler(optimizer)
        self.engine = ZeroRedundancyEngine(module, model, optimizer, scheduler, self.config.max_grad_norm)
        return self.engine

    @hookimpl
    def ktrain_save_checkpoint(self, engine: ZeroRedundancyEngine, run: Any, path: Path) -> dict[str, Any]:
        """Gather the optimizer state to rank 0 (every rank takes part), which writes the checkpoint."""
        return checkpoint.save(engine, run, path)

    @hookimpl
    def ktrain_load_checkpoint(self, engine: ZeroRedundancyEngine, run: Any, path: Path, manifest: dict) -> bool:
        """Every rank reads the weights and keeps its own share of the optimizer state."""
        return checkpoint.load(engine, run, path, manifest)

    @hookimpl
    def ktrain_collect_metrics(self, run: Any, step: int) -> dict[str, float]:
        """``optimizer_state_mib``: the optimizer state rank 0 holds (half of the whole on 2 ranks)."""
        return {"optimizer_state_mib": self.engine.local_optimizer_bytes() / 2**20}
