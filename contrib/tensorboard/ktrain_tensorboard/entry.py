"""Entry module: the ``use_tensorboard`` key (``keys``), the ``tensorboard`` metric sink and the ``plot`` command.

Imports nothing heavy: the sink (torch, tensorboard) and the plot (matplotlib) are lazy references,
imported when a run opens the sink or when ``ktrain plot`` runs.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain.registry import lazy
from ktrain_tensorboard.keys import TensorBoardKeys


@hookimpl
def ktrain_register_config(register: Any) -> None:
    """Declare ``use_tensorboard``."""
    register(TensorBoardKeys)


@hookimpl
def ktrain_register_metric_sinks(register: Any) -> None:
    """The ``tensorboard`` sink; it opens only in runs that set ``use_tensorboard: true``."""
    register("tensorboard", lazy("ktrain_tensorboard.sink:open_sink"))


@hookimpl
def ktrain_register_commands(register: Any) -> None:
    """``ktrain plot RUN_DIR``: loss, eval loss, learning rate and tokens/s of a run, as a PNG."""
    register(
        "plot",
        "draw a run's loss, eval loss, learning rate and tokens/s into a PNG",
        lazy("ktrain_tensorboard.plot:configure"),
        lazy("ktrain_tensorboard.plot:run"),
    )
