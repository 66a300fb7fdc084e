"""ktrain: a microkernel trainer for large language models.

The kernel is a small training loop that calls pluggy hooks (see ``ktrain.hookspecs``); everything else
is a plugin found through the ``ktrain`` entry-point group. Importing this package imports no torch.
"""

import pluggy

__version__ = "0.1.0"

PROJECT = "ktrain"
ENTRY_POINT_GROUP = "ktrain"
DISTRIBUTION = "ktrain-llm"
"""The kernel's distribution name on package indexes (``pip install ktrain-llm``); the import name is ``ktrain``."""

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marker for hook implementations: ``@ktrain.hookimpl def ktrain_wrap_model(...)``."""

__all__ = ["DISTRIBUTION", "ENTRY_POINT_GROUP", "PROJECT", "__version__", "hookimpl"]
