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
    from ktrain_fsdp.runtime import Fsdp

    options = resolve(config, Report())
    keys = tuple(name for name in ("fsdp_version", "fsdp_config", "fsdp") if config.is_set(name))
    activate(Fsdp(config, options), roles=("sharding", "checkpoint_format"), keys=keys)
    if options.cpu_ram_efficient_loading:
        from ktrain_fsdp.loading import RamEfficientLoader

        activate(RamEfficientLoader(config, options.version), roles=("model_loader",), keys=("fsdp_config",))


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
