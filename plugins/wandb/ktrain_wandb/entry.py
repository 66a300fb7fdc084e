"""Entry module of ktrain-plugin-wandb: the ``wandb_*`` keys, and the tracker when they ask for it.

Imports nothing heavy: ``ktrain_wandb.tracker`` is imported only in runs that are tracked, and it
imports wandb only when rank 0 opens the W&B run.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_wandb.keys import WandbKeys

OPTIONS = ("wandb_entity", "wandb_name", "wandb_run_id", "wandb_mode", "wandb_watch", "wandb_log_model")


def given(config: Any, name: str) -> bool:
    """Whether the config sets ``name`` to a real value (not left out, not null, not empty)."""
    return config.is_set(name) and getattr(config, name) not in (None, "")


def tracked(config: Any) -> bool:
    """Axolotl's rule: W&B tracks the run when ``wandb_project`` is set, unless ``use_wandb`` says otherwise or
    ``wandb_mode`` is ``disabled``."""
    wanted = config.use_wandb if given(config, "use_wandb") else given(config, "wandb_project")
    return bool(wanted) and config.wandb_mode != "disabled"


@hookimpl
def ktrain_register_config(register: Any) -> None:
    """Declare the ``wandb_*`` keys and ``use_wandb``."""
    register(WandbKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """W&B keys written in a run that W&B does not track."""
    if tracked(config):
        return
    for name in OPTIONS:
        if given(config, name) and name != "wandb_mode":
            report.warn(name, "has no effect: W&B tracks a run only with wandb_project (or use_wandb: true)")


@hookimpl
def ktrain_activate(config: Any, activate: Any) -> None:
    """Activate the tracker in runs that W&B tracks."""
    if not tracked(config):
        return
    keys = tuple(name for name in ("use_wandb", "wandb_project", *OPTIONS) if given(config, name))
    activate("ktrain_wandb.entry:tracker", keys=keys)


def tracker(config: Any) -> Any:
    """The tracker (its module imports wandb when rank 0 opens the run): built by the kernel on the ranks."""
    from ktrain_wandb.tracker import WandbTracker

    return WandbTracker()
