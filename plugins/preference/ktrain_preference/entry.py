"""Entry module of ktrain-plugin-preference: the rl keys, their checks, and the pair dataset format.

Imports nothing heavy: torch is imported by the runtime object (``ktrain_preference.runtime``), which
is activated only when ``rl`` is written, and owns the run's objective.
"""

from __future__ import annotations

from typing import Any

import attrs

from ktrain import hookimpl
from ktrain_preference.axolotl_types import axolotl_format, kto_type_names, type_names
from ktrain_preference.checks import validate
from ktrain_preference.formats import tokenize_preference
from ktrain_preference.keys import PAIR_FORMAT, PreferenceKeys


@hookimpl
def ktrain_register_config(register) -> None:
    register(PreferenceKeys)


@hookimpl
def ktrain_register_dataset_formats(register) -> None:
    register(PAIR_FORMAT, tokenize_preference)
    for name, (family, strategy) in {**kto_type_names(), **type_names()}.items():
        register(name, axolotl_format(family, strategy))


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """The method, the datasets' type and packing (``ktrain_preference.checks``)."""
    validate(config, report)


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Preference tuning takes part when ``rl`` is written; it owns the run's objective."""
    if config.rl is None:
        return
    keys = tuple(field.name for field in attrs.fields(PreferenceKeys) if config.is_set(field.name))
    activate("ktrain_preference.runtime:Preference", roles=("objective",), keys=keys)


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """The preference run's part of one rank's memory model (``ktrain_preference.memory``)."""
    from ktrain_preference.memory import collect_memory

    return collect_memory(config)
