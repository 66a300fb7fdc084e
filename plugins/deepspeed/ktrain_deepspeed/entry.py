"""The entry module of ktrain-plugin-deepspeed: the ``deepspeed`` key, its checks, ``ktrain fetch``, the reader.

Imports nothing heavy. When ``deepspeed:`` is written, ``ktrain_activate`` registers the runtime object
(``ktrain_deepspeed.runtime``), which claims the roles ``sharding`` and ``checkpoint_format`` and imports
DeepSpeed.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from ktrain import hookimpl
from ktrain.registry import lazy
from ktrain_deepspeed import presets
from ktrain_deepspeed.checks import validate
from ktrain_deepspeed.keys import DeepSpeedKeys
from ktrain_deepspeed.source import SourceError, read

KTRAIN_ROLES = ("sharding", "checkpoint_format")
FORMAT = "deepspeed"


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``deepspeed``."""
    register(DeepSpeedKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any, launch: Any) -> None:
    """Read ``deepspeed:`` and check it against the rest of the config (``ktrain_deepspeed.checks``), then
    with DeepSpeed's own parser and against this machine (which imports DeepSpeed, and torch with it; where
    DeepSpeed is not installed the kernel reports the missing requirement instead; not for a layout
    ``ktrain plan`` tries, ``launch.planned``)."""
    validate(config, report)
    planned = launch is not None and launch.planned
    if config.deepspeed is None or planned or importlib.util.find_spec("deepspeed") is None:
        return
    try:
        source = read(config.deepspeed)
    except SourceError:
        return  # validate reported it
    from ktrain_deepspeed import machine, schema

    found = schema.problems(source.settings, config) or machine.problems(schema.probe(source.settings, config))
    for path, message in found:
        report.error(f"deepspeed.{path}" if path else "deepspeed", f"{message}, in {source.origin}")


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Take the ``sharding`` and ``checkpoint_format`` roles when ``deepspeed`` is written."""
    if config.deepspeed is None:
        return
    activate("ktrain_deepspeed.runtime:DeepSpeedRuntime", roles=KTRAIN_ROLES, keys=("deepspeed",))


@hookimpl
def ktrain_register_commands(register) -> None:
    """``ktrain fetch deepspeed_configs [DIR]``: copy the installed presets into a folder, offline."""
    register(
        "fetch",
        "copy the DeepSpeed presets into a folder: fetch deepspeed_configs [DIR]",
        presets.configure,
        presets.run,
    )


@hookimpl
def ktrain_register_checkpoint_formats(register) -> None:
    """``ktrain export`` consolidates ``deepspeed`` checkpoints to fp32 on one CPU process."""
    register(FORMAT, lazy("ktrain_deepspeed.checkpoint:read_state_dict"))


@hookimpl
def ktrain_collect_memory(config: Any, mesh: Any, model_shape: Any) -> dict[str, Any] | None:
    """ZeRO's part of one rank's memory model (``ktrain_deepspeed.memory``): partitions, buffers, offload."""
    from ktrain_deepspeed.memory import collect_memory

    return collect_memory(config, mesh, model_shape)
