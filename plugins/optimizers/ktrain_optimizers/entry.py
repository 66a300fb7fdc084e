"""Entry module of ktrain-plugin-optimizers: Axolotl's 8-bit, 4-bit, paged, Lion and Muon optimizer names.

Imports nothing heavy: each name is registered as a lazy reference, so bitsandbytes, torchao and torch are
imported only when a rank builds the optimizer; ``ktrain check`` stays light.
"""

from __future__ import annotations

import functools
from typing import Any

from ktrain import hookimpl
from ktrain.registry import lazy
from ktrain_optimizers.keys import BITSANDBYTES, MUON, NAMES


@hookimpl
def ktrain_register_optimizers(register) -> None:
    """Register every name of ``keys.NAMES``, each building its library's class, and ``muon``."""
    for name in NAMES:
        register(name, functools.partial(lazy("ktrain_optimizers.runtime:build"), name))
    register(MUON, lazy("ktrain_optimizers.muon:build"))


@hookimpl
def ktrain_validate_config(config: Any, report: Any, launch: Any) -> None:
    """A paged bitsandbytes optimizer on CPU ranks: bitsandbytes pages only CUDA memory, and falls back to the
    non-paged optimizer (same updates). Muon with FSDP or DeepSpeed."""
    paged = config.optimizer in BITSANDBYTES and config.optimizer.startswith("paged_")
    if paged and launch is not None and launch.device == "cpu":
        report.warn(
            "optimizer",
            f"{config.optimizer} pages its states only on CUDA; on these CPU ranks bitsandbytes runs it unpaged",
        )
    if config.optimizer == MUON:
        for name in ("fsdp_version", "fsdp_config", "fsdp", "deepspeed"):
            if config.is_set(name) and getattr(config, name):
                report.error(
                    "optimizer",
                    f"muon trains on one process or DDP ranks, not with {name} (sharded weights are not "
                    "orthogonalized whole); leave out one of them",
                )
                break


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Active for the plugin's optimizer names: note the library class on rank 0; for muon, own the
    ``optimizer`` role (its builder needs the model's embeddings)."""
    if config.optimizer == MUON:
        activate("ktrain_optimizers.muon:MuonBuilder", keys=("optimizer",), roles=("optimizer",))
    if config.optimizer not in (*NAMES, MUON):
        return
    activate("ktrain_optimizers.note:OptimizerNote", keys=("optimizer",))


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """The optimizer's states in one rank's memory model (``ktrain_optimizers.memory``)."""
    from ktrain_optimizers.memory import collect_memory

    return collect_memory(config)
