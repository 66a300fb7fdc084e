"""ktrain: a microkernel trainer for large language models.

The kernel is a small training loop that calls pluggy hooks (see ``ktrain.hookspecs``); everything else
is a plugin found through the ``ktrain`` entry-point group. Importing this package imports no torch.
"""

import pluggy

__version__ = "0.1.0"

PROJECT = "ktrain"
ENTRY_POINT_GROUP = "ktrain"

hookimpl = pluggy.HookimplMarker(PROJECT)
"""Marker for hook implementations: ``@ktrain.hookimpl def ktrain_wrap_model(...)``."""

__all__ = ["ENTRY_POINT_GROUP", "PROJECT", "__version__", "hookimpl"]
