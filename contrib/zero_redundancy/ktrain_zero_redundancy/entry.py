"""Entry module: declares the ``zero_redundancy`` keys, checks them, activates the runtime object, and registers
the checkpoint reader for ``ktrain export``.

Imports nothing heavy: torch is imported by the runtime object, activated only when the config sets
``zero_redundancy: true``.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain.registry import lazy
from ktrain_zero_redundancy.checkpoint import FORMAT
from ktrain_zero_redundancy.keys import ZeroRedundancyKeys

KTRAIN_ROLES = ("sharding", "checkpoint_format")


@hookimpl
def ktrain_register_config(register: Any) -> None:
    """Declare ``zero_redundancy`` and ``zero_redundancy_bucket_view``."""
    register(ZeroRedundancyKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """ZeRO shards over every rank: no tensor or context parallelism beside it."""
    if not config.zero_redundancy:
        if config.zero_redundancy_bucket_view:
            report.warn("zero_redundancy_bucket_view", "has no effect without zero_redundancy: true")
        return
    for name in ("tensor_parallel_size", "context_parallel_size"):
        if getattr(config, name) != 1:
            report.error(
                name,
                "zero_redundancy shards the optimizer over every rank, so every rank must be data parallel: "
                f"set {name}: 1, or remove zero_redundancy",
            )


@hookimpl
def ktrain_activate(config: Any, activate: Any) -> None:
    """Own ``sharding`` and ``checkpoint_format`` when ``zero_redundancy: true``."""
    if config.zero_redundancy:
        from ktrain_zero_redundancy.runtime import ZeroRedundancy

        activate(ZeroRedundancy(config), roles=KTRAIN_ROLES, keys=("zero_redundancy",))


@hookimpl
def ktrain_register_checkpoint_formats(register: Any) -> None:
    """``ktrain export`` reads this plugin's checkpoints on one CPU process."""
    register(FORMAT, lazy("ktrain.builtin.local_checkpoint:read_state_dict"))
