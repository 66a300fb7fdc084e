"""Named things plugins register through ``ktrain_register_*`` callbacks, with who registered each."""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from typing import Any

from ktrain.plugins import PluginError, PluginInfo, Plugins


def lazy(target: str) -> Callable[..., Any]:
    """A callable standing for ``"module:function"``, imported on first call (keeps torch out of the CLI)."""
    module_name, attr = target.split(":")

    def call(*args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(module_name), attr)(*args, **kwargs)

    call.__name__ = attr
    call.__qualname__ = target
    return call


class Registry:
    """Name -> registered object, for one ``ktrain_register_*`` hook; a name given twice is an error."""

    def __init__(self, what: str):
        self.what = what
        self.items: dict[str, tuple[Any, PluginInfo]] = {}

    def register(self, name: str, obj: Any, *, plugin: PluginInfo) -> None:
        if name in self.items:
            other = self.items[name][1]
            raise PluginError(
                f"{self.what} '{name}' is registered by two plugins: {other.describe()} and {plugin.describe()}"
            )
        self.items[name] = (obj, plugin)

    def get(self, name: str, key: str) -> Any:
        """The object registered as ``name``; a KeyError-free lookup whose error names the config key."""
        if name not in self.items:
            raise LookupError(self.unknown(name, key))
        return self.items[name][0]

    def unknown(self, name: str, key: str) -> str:
        close = difflib.get_close_matches(name, list(self.items), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        return f"no {self.what} named '{name}' ({key}); {hint}known: {', '.join(sorted(self.items))}"

    def __contains__(self, name: str) -> bool:
        return name in self.items


def collect(plugins: Plugins, hook_name: str, what: str) -> Registry:
    """Call ``hook_name`` on every plugin with a ``register`` callback; return what they registered."""
    registry = Registry(what)

    def register(name: str, obj: Any, *, plugin: PluginInfo) -> None:
        registry.register(name, obj, plugin=plugin)

    plugins.call_with_callback(hook_name, register=register)
    return registry
