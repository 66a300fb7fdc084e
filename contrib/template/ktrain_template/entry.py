"""Entry module: registers the ``new-plugin`` command (and nothing else: no keys, no runtime object)."""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain.registry import lazy


@hookimpl
def ktrain_register_commands(register: Any) -> None:
    """``ktrain new-plugin NAME``: a new plugin package, ready to ``pip install -e`` and test."""
    register(
        "new-plugin",
        "write a new plugin package: entry point, keys, runtime object, tests, README",
        lazy("ktrain_template.render:configure"),
        lazy("ktrain_template.render:run"),
    )
