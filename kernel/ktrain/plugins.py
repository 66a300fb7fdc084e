"""The plugins of one command: who each is, what it activated and owns, and the one dispatcher of every hook.

Plugins are entry points of the group ``ktrain``; each names an *entry module* that must import
nothing heavy. ``ktrain.config.activation`` finds them (``discover()``) and lets each decide, from the
config, whether it takes part and which roles it claims (``activate()``); this module holds the result
(``Plugins``), the roles and their default owners, and calls hooks through ``Plugins``' dispatcher.
It imports no hook specification, so that a type of the contract can name ``Plugins`` without a circle.
"""

from __future__ import annotations

from typing import Any

import attrs
import pluggy

from ktrain import DISTRIBUTION, __version__

KERNEL_ENTRY = "ktrain.builtin.kernel"

# role -> "module:attribute" of the object that owns it when no plugin claims it.
DEFAULT_OWNERS: dict[str, str] = {
    "model_loader": "ktrain.builtin.hf_model:HFModel",
    "export": "ktrain.builtin.hf_model:HFModel",
    "sharding": "ktrain.builtin.data_parallel:DataParallel",
    "optimizer": "ktrain.builtin.optimizers:DefaultOptimizer",
    "lr_scheduler": "ktrain.builtin.schedulers:DefaultScheduler",
    "checkpoint_format": "ktrain.builtin.local_checkpoint:LocalCheckpoint",
    "objective": "ktrain.builtin.causal_lm:CausalLM",
}

# hook -> the role whose owner alone may implement it (the first-result hooks: one answer per run).
OWNED_HOOKS: dict[str, str] = {
    "ktrain_load_tokenizer": "model_loader",
    "ktrain_load_model": "model_loader",
    "ktrain_shard": "sharding",
    "ktrain_shard_frozen": "sharding",
    "ktrain_build_optimizer": "optimizer",
    "ktrain_build_lr_scheduler": "lr_scheduler",
    "ktrain_save_checkpoint": "checkpoint_format",
    "ktrain_load_checkpoint": "checkpoint_format",
    "ktrain_export_model": "export",
    "ktrain_build_objective": "objective",
}


class PluginError(Exception):
    """A plugin could not be loaded, or two plugins claim one role; the message names them."""


@attrs.frozen
class PluginInfo:
    """An installed plugin: its entry-point name, the distribution that ships it, and its version."""

    name: str
    distribution: str
    version: str
    module: Any = attrs.field(eq=False, repr=False)

    def describe(self) -> str:
        return f"'{self.name}' ({self.distribution} {self.version})"


@attrs.frozen
class Activation:
    """A runtime object registered for this run, the roles it owns and the keys that enabled it."""

    plugin: PluginInfo
    obj: Any = attrs.field(eq=False, repr=False)
    roles: tuple[str, ...]
    keys: tuple[str, ...]
    default: bool = False


KERNEL_INFO_NAME = "kernel"


@attrs.define
class Plugins:
    """The plugin manager of one command, with what each plugin is and what it owns in this run."""

    pm: pluggy.PluginManager
    infos: list[PluginInfo]
    activations: list[Activation] = attrs.Factory(list)

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def role_owners(self) -> dict[str, Activation]:
        return {role: act for act in self.activations for role in act.roles}

    def info_of(self, module: Any) -> PluginInfo | None:
        return next((i for i in self.infos if i.module is module), None)

    def call_with_callback(self, hook_name: str, **kwargs: Any) -> None:
        """Call a ``register_*`` hook on each plugin in turn, telling ``kwargs['register']`` who calls.

        ``kwargs['register']`` must accept the calling ``PluginInfo`` as keyword ``plugin``; the
        plugin itself sees a callback without it.
        """
        register = kwargs.pop("register")
        caller = getattr(self.pm.hook, hook_name)
        for impl in reversed(caller.get_hookimpls()):
            info = self.owner_of(impl.plugin)

            def bound(*args: Any, _info: PluginInfo = info, **kw: Any) -> Any:
                return register(*args, plugin=_info, **kw)

            args = {"register": bound, **kwargs}
            impl.function(**{name: args[name] for name in impl.argnames})

    def transform(self, hook_name: str, value_name: str, value: Any, **kwargs: Any) -> Any:
        """Call a transforming hook (``ktrain_wrap_model``, ``ktrain_parallelize``, ``ktrain_wrap_train_step``) on
        each plugin in turn, in pluggy's calling order (the plugin registered last first; ``tryfirst``/``trylast``
        move one), each getting the previous result as ``value_name``; an answer of None keeps the value."""
        for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):
            args = {value_name: value, **kwargs}
            result = impl.function(**{name: args[name] for name in impl.argnames})
            if result is not None:
                value = result
        return value

    def collect_mapping(self, hook_name: str, what: str, **kwargs: Any) -> dict[str, tuple[Any, PluginInfo]]:
        """Merge the dict answers of a ``collect_*`` hook into name -> (value, the plugin that gave it).

        Raises ``PluginError`` naming both plugins, their distributions and versions, when two give one name.
        """
        out: dict[str, tuple[Any, PluginInfo]] = {}
        for impl in reversed(getattr(self.pm.hook, hook_name).get_hookimpls()):
            info = self.owner_of(impl.plugin)
            for name, value in (impl.function(**{n: kwargs[n] for n in impl.argnames}) or {}).items():
                if name in out:
                    raise PluginError(
                        f"the {what} '{name}' is given by two plugins: {out[name][1].describe()} and "
                        f"{info.describe()}; remove the keys of one of them from the config"
                    )
                out[name] = (value, info)
        return out

    def collect(self, hook_name: str, what: str, **kwargs: Any) -> dict[str, Any]:
        """``collect_mapping`` without the plugins: name -> value."""
        return {name: value for name, (value, _) in self.collect_mapping(hook_name, what, **kwargs).items()}

    def owner_of(self, obj: Any) -> PluginInfo:
        """The plugin that registered ``obj`` (an entry module or a runtime object); the kernel for its own."""
        info = self.info_of(obj)
        if info is not None:
            return info
        for act in self.activations:
            if act.obj is obj:
                return act.plugin
        return PluginInfo(KERNEL_INFO_NAME, DISTRIBUTION, __version__, obj)
