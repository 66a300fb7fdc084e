"""The runtime object of a run with FSDP: sharding, and DCP checkpoints.

Registered by the entry module only when an FSDP key is written; its methods import torch when called,
so that ``ktrain check`` stays light.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ktrain import hookimpl
from ktrain_fsdp.options import FsdpOptions


class Fsdp:
    """Owner of ``sharding`` (FSDP2, FSDP1 or HSDP) and of ``checkpoint_format`` (``ktrain-dcp``)."""

    def __init__(self, config: Any, options: FsdpOptions):
        self.config = config
        self.options = options

    @hookimpl
    def ktrain_shard(self, model: Any, run: Any, build_optimizer: Any, build_lr_scheduler: Any) -> Any:
        """Shard ``model`` over the data-parallel mesh; the optimizer is built on the sharded parameters."""
        from ktrain_fsdp.sharding import shard

        return shard(model, run, self.options, build_optimizer, build_lr_scheduler)

    @hookimpl
    def ktrain_shard_frozen(self, module: Any, run: Any) -> Any:
        """FSDP2: the frozen module sharded over the policy's mesh, forward only; FSDP1: whole on every rank."""
        from ktrain_fsdp.sharding import shard_frozen

        return shard_frozen(module, run, self.options)

    @hookimpl
    def ktrain_save_checkpoint(self, engine: Any, run: Any, path: Path) -> dict[str, Any]:
        """Trainable parameters, changing buffers and the optimizer through DCP; the scheduler from rank 0."""
        from ktrain_fsdp.checkpoint import save

        return save(engine, run, path, self.options)

    @hookimpl
    def ktrain_load_checkpoint(self, engine: Any, run: Any, path: Path, manifest: dict[str, Any]) -> bool:
        """Restore a ``ktrain-dcp`` checkpoint, written at any world size."""
        from ktrain_fsdp.checkpoint import load

        load(engine, run, path, manifest)
        return True
