"""The entry module of ktrain-plugin-fsdp: keys, checks, the ``migrate`` command and the DCP reader.

Imports nothing heavy. When ``fsdp_version``, ``fsdp_config`` or ``fsdp`` is written, ``ktrain_activate``
registers the runtime object (roles ``sharding`` and ``checkpoint_format``) and, under
``cpu_ram_efficient_loading``, the loader that builds the model on the meta device off rank 0
(role ``model_loader``).
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain.config.report import Report
from ktrain.registry import lazy
from ktrain_fsdp.keys import FsdpKeys
from ktrain_fsdp.options import enabled, resolve

KTRAIN_ROLES = ("sharding", "checkpoint_format", "model_loader")
FORMAT = "ktrain-dcp"


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``fsdp_version``, ``fsdp_config`` and ``fsdp``."""
    register(FsdpKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """Resolve the FSDP keys: FSDP1 spellings under FSDP2 are notes with the new spelling, or errors; the
    block classes to wrap must exist in a local base model's architecture."""
    if enabled(config):
        from ktrain_fsdp.model_classes import check_layer_classes

        check_layer_classes(config, resolve(config, report), report)


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Take the ``sharding`` and ``checkpoint_format`` roles when an FSDP key is written."""
    if not enabled(config):
        return
    keys = tuple(name for name in ("fsdp_version", "fsdp_config", "fsdp") if config.is_set(name))
    activate("ktrain_fsdp.entry:sharding", roles=("sharding", "checkpoint_format"), keys=keys)
    if resolve(config, Report()).cpu_ram_efficient_loading:
        activate("ktrain_fsdp.entry:loader", roles=("model_loader",), keys=("fsdp_config",))


def sharding(config: Any) -> Any:
    """The runtime object that shards and checkpoints (imports torch): built by the kernel on the ranks."""
    from ktrain_fsdp.runtime import Fsdp

    return Fsdp(config, resolve(config, Report()))


def loader(config: Any) -> Any:
    """The loader that builds the model on the meta device off rank 0 (imports torch): built on the ranks."""
    from ktrain_fsdp.loading import RamEfficientLoader

    return RamEfficientLoader(config, resolve(config, Report()).version)


@hookimpl
def ktrain_register_commands(register) -> None:
    """``ktrain migrate CONFIG``: rewrite an FSDP1 config for FSDP2, keeping comments."""
    from ktrain_fsdp.migrate_command import configure

    register(
        "migrate",
        "rewrite an FSDP1 config as FSDP2, keeping comments",
        configure,
        lazy("ktrain_fsdp.migrate_command:run"),
    )


@hookimpl
def ktrain_register_checkpoint_formats(register) -> None:
    """``ktrain export`` reads ``ktrain-dcp`` checkpoints on one CPU process."""
    register(FORMAT, lazy("ktrain_fsdp.checkpoint:read_state_dict"))


@hookimpl
def ktrain_collect_memory(config: Any, mesh: Any) -> dict[str, Any] | None:
    """FSDP's part of one rank's memory model (``ktrain_fsdp.memory``): shards, gradients, states, buffers."""
    from ktrain_fsdp.memory import collect_memory

    return collect_memory(config, mesh)
