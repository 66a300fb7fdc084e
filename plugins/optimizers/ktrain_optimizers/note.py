"""The runtime object of ktrain-plugin-optimizers: rank 0 names the library class it trains with.

Imports no torch, so that activating it (``ktrain check`` does) stays light.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl

LIBRARIES = ("bitsandbytes", "torchao")
"""The libraries whose classes are named by their ``optim`` module (as their users import them)."""


class OptimizerNote:
    """Active when ``optimizer`` is one of the plugin's names: rank 0 prints the library class it trains with."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl
    def ktrain_on_train_start(self, run: Any, engine: Any) -> None:
        """Print ``optimizers: NAME is LIBRARY.optim.CLASS`` once, from the main rank."""
        if run.is_main:
            cls = type(engine.optimizer)
            root = cls.__module__.split(".")[0]
            where = f"{root}.optim.{cls.__name__}" if root in LIBRARIES else f"{cls.__module__}.{cls.__name__}"
            print(f"optimizers: {self.config.optimizer} is {where}", flush=True)
