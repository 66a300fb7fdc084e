"""Entry module of ktrain-plugin-optimizers: Axolotl's 8-bit, 4-bit, paged and Lion optimizer names.

Imports nothing heavy: each name is registered as a lazy reference, so bitsandbytes, torchao and torch are
imported only when a rank builds the optimizer; ``ktrain check`` stays light.
"""

from __future__ import annotations

import functools
from typing import Any

from ktrain import hookimpl
from ktrain.registry import lazy
from ktrain_optimizers.keys import BITSANDBYTES, NAMES


@hookimpl
def ktrain_register_optimizers(register) -> None:
    """Register every name of ``keys.NAMES``, each building its library's class."""
    for name in NAMES:
        register(name, functools.partial(lazy("ktrain_optimizers.runtime:build"), name))


@hookimpl
def ktrain_validate_config(config: Any, report: Any, launch: Any) -> None:
    """A paged bitsandbytes optimizer on CPU ranks: bitsandbytes pages only CUDA memory, and falls back to the
    non-paged optimizer (same updates)."""
    paged = config.optimizer in BITSANDBYTES and config.optimizer.startswith("paged_")
    if paged and launch is not None and launch.device == "cpu":
        report.warn(
            "optimizer",
            f"{config.optimizer} pages its states only on CUDA; on these CPU ranks bitsandbytes runs it unpaged",
        )


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Active for the plugin's optimizer names: note the library class on rank 0."""
    if config.optimizer not in NAMES:
        return
    activate("ktrain_optimizers.note:OptimizerNote", keys=("optimizer",))


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """The optimizer's states in one rank's memory model (``ktrain_optimizers.memory``)."""
    from ktrain_optimizers.memory import collect_memory

    return collect_memory(config)
