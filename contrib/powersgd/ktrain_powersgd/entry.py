"""Entry module of ktrain-plugin-powersgd: its keys, their checks, and its activation. Imports no torch."""

from typing import Any

from ktrain import hookimpl
from ktrain_powersgd.keys import PowerSGDKeys

KTRAIN_ROLES = ("ddp:comm_hook",)


@hookimpl
def ktrain_register_config(register: Any) -> None:
    """Declare ``powersgd``, ``powersgd_rank`` and ``powersgd_start_step``."""
    register(PowerSGDKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """The tuning keys alone do nothing (their ranges are checked by their validators, in keys.py)."""
    if not config.powersgd:
        for name in ("powersgd_rank", "powersgd_start_step"):
            if config.is_set(name):
                report.warn(name, "has no effect without powersgd: true")


@hookimpl
def ktrain_activate(config: Any, activate: Any) -> None:
    """Take part when ``powersgd: true``; claim ``ddp:comm_hook`` so that a second comm hook is refused."""
    if config.powersgd:
        from ktrain_powersgd.runtime import PowerSGD

        activate(PowerSGD(config), roles=KTRAIN_ROLES, keys=("powersgd",))
