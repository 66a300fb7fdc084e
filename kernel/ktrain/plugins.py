"""Finding plugins, activating them for a run, and giving every exclusive role exactly one owner.

Plugins are entry points of the group ``ktrain``; each names an *entry module* that must import
nothing heavy. ``discover()`` registers the kernel's own entry module and every installed one;
``activate()`` lets each decide, from the config, whether it takes part and which roles it claims.
The kernel's defaults own the roles nobody claimed; their modules import torch, so they are only
imported when a run starts.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import importlib.util
import re
from collections.abc import Iterable
from typing import Any

import attrs
import pluggy

from ktrain import DISTRIBUTION, ENTRY_POINT_GROUP, PROJECT, __version__, hookspecs

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


def discover(extra: Iterable[tuple[str, Any]] = ()) -> Plugins:
    """Register the kernel's entry module, every installed ``ktrain`` entry point, and ``extra``.

    ``extra`` holds ``(name, module)`` pairs registered as if installed (tests use it). Raises
    ``PluginError`` naming the entry point and its distribution when one fails to load or implements
    a hook that does not exist.
    """
    pm = pluggy.PluginManager(PROJECT)
    pm.add_hookspecs(hookspecs)
    infos = [PluginInfo(KERNEL_INFO_NAME, DISTRIBUTION, __version__, importlib.import_module(KERNEL_ENTRY))]
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        dist = ep.dist.name if ep.dist else "?"
        version = ep.dist.version if ep.dist else "?"
        try:
            module = ep.load()
        except Exception as e:
            raise PluginError(
                f"plugin '{ep.name}' from {dist} {version} failed to load ({ep.value}): "
                f"{type(e).__name__}: {e}. Reinstall it, or uninstall it with `pip uninstall {dist}`."
            ) from None
        infos.append(PluginInfo(ep.name, dist, version, module))
    infos += [PluginInfo(name, "(registered in process)", "-", module) for name, module in extra]
    for info in infos:
        try:
            pm.register(info.module, name=info.name)
        except (pluggy.PluginValidationError, ValueError) as e:
            raise PluginError(f"plugin {info.describe()} is not valid: {e}") from None
    plugins = Plugins(pm, infos)
    _check_pending(plugins)
    for info in infos:
        _check_owned_hooks(plugins, info, info.module, ())
    return plugins


def _check_owned_hooks(plugins: Plugins, info: PluginInfo, obj: Any, roles: tuple[str, ...]) -> None:
    """Raise ``PluginError`` naming the plugin and the hook when ``obj`` answers a role's hook without claiming it."""
    for caller in plugins.pm.get_hookcallers(obj) or ():
        role = OWNED_HOOKS.get(caller.name)
        if role is None or role in roles:
            continue
        if obj is info.module:
            where = f"in its entry module {info.module.__name__}, which takes part in every run"
            fix = f"move it to a runtime object activated with activate(obj, roles=('{role}',))"
        else:
            where = f"on its runtime object {type(obj).__name__} without claiming the role '{role}'"
            fix = f"pass roles=('{role}', ...) to activate(), or remove the hook"
        raise PluginError(f"plugin {info.describe()} implements {caller.name} {where}: {fix}")


def _check_pending(plugins: Plugins) -> None:
    """Raise ``PluginError`` naming the plugin when one implements a hook that does not exist."""
    try:
        plugins.pm.check_pending()
    except pluggy.PluginValidationError as e:
        name = next(
            n
            for n, caller in vars(plugins.pm.hook).items()
            if not n.startswith("_") and not caller.has_spec()
            for impl in caller.get_hookimpls()
            if impl.plugin is e.plugin and not impl.optionalhook
        )
        close = difflib.get_close_matches(name, [n for n in vars(hookspecs) if n.startswith("ktrain_")], n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise PluginError(
            f"plugin {plugins.owner_of(e.plugin).describe()} implements '{name}', which is not a hook of "
            f"ktrain {__version__}{hint} (`ktrain hooks` lists them)"
        ) from None


def activate(plugins: Plugins, config: Any, *, with_defaults: bool) -> list[tuple[str, str]]:
    """Let every plugin activate its runtime object for ``config``; give each role one owner.

    A plugin passes ``activate`` its runtime object, or the ``"module:attribute"`` of a callable that
    builds it from the config (a class taking the config, or a factory): that one is built only with
    ``with_defaults`` (on the ranks, and in the commands that load a model), so the config phase imports
    no runtime module. With ``with_defaults`` the kernel's default owners (which import torch) are
    registered for the roles nobody claimed too. Returns ``(config key, message)`` for what the checks can
    go on after: a role claimed by a second plugin (both named, with their distributions, versions and
    keys; the second is left out) and an unconditional requirement of an active plugin's distribution that
    is not installed (with the command that installs it). Raises ``PluginError`` for an object that is not
    valid.
    """
    claimed: dict[str, Activation] = {}
    problems: list[tuple[str, str]] = []
    for impl in reversed(plugins.pm.hook.ktrain_activate.get_hookimpls()):
        info = plugins.owner_of(impl.plugin)

        def register(obj: Any, *, roles: Iterable[str] = (), keys: Iterable[str] = (), _info=info) -> None:
            act = Activation(_info, obj, tuple(roles), tuple(keys))
            clash = next((role for role in act.roles if role in claimed), None)
            if clash is not None:
                problems.append(("", _conflict(clash, claimed[clash], act)))
                return
            missing = _missing_requirements(_info)
            if missing:
                problems.append((act.keys[0] if act.keys else "", _missing_message(act, missing)))
            claimed.update(dict.fromkeys(act.roles, act))
            if isinstance(obj, str) and (missing or not with_defaults):
                if not missing:
                    _check_target(_info, obj)
                plugins.activations.append(act)
                return
            if isinstance(obj, str):
                act = attrs.evolve(act, obj=_build(_info, obj, config))
            plugins.activations.append(act)
            try:
                plugins.pm.register(act.obj, name=f"{_info.name}:{type(act.obj).__name__}:{len(plugins.activations)}")
            except (pluggy.PluginValidationError, ValueError) as e:
                raise PluginError(f"plugin {_info.describe()} activated an invalid object: {e}") from None
            _check_owned_hooks(plugins, _info, act.obj, act.roles)

        args = {"config": config, "activate": register}
        impl.function(**{name: args[name] for name in impl.argnames})
    kernel = plugins.infos[0]
    owners: dict[str, Any] = {}
    for role, target in DEFAULT_OWNERS.items():
        if role in claimed:
            continue
        if not with_defaults:
            plugins.activations.append(Activation(kernel, target, (role,), (), default=True))
            continue
        if target not in owners:
            owners[target] = _build(kernel, target, config)
            plugins.pm.register(owners[target], name=f"default:{target}")
        plugins.activations.append(Activation(kernel, owners[target], (role,), (), default=True))
    _check_pending(plugins)
    return problems


def _check_target(info: PluginInfo, target: str) -> None:
    """Raise ``PluginError`` unless ``target`` is ``"module:attribute"`` of a module that exists (not imported)."""
    module_name, _, attr = target.partition(":")
    try:
        found = bool(attr) and importlib.util.find_spec(module_name) is not None
    except (ImportError, ValueError):
        found = False
    if not found:
        raise PluginError(
            f"plugin {info.describe()} activated '{target}', which names no module:attribute; "
            'pass the runtime object or "package.module:Class"'
        )


def _build(info: PluginInfo, target: str, config: Any) -> Any:
    """Import ``"module:attribute"`` and call it with the config: the runtime object of a lazy activation."""
    module_name, attr = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as e:
        raise PluginError(
            f"plugin {info.describe()} needs the module '{e.name}', which is not installed: "
            f"`pip install {e.name}`, or reinstall {info.distribution}"
        ) from None
    return getattr(module, attr)(config)


@functools.cache
def _missing_requirements(info: PluginInfo) -> tuple[str, ...]:
    """The requirements of ``info``'s distribution without environment markers that are not installed."""
    if info.distribution == DISTRIBUTION:
        return ()  # the kernel's own: installed with it
    try:
        requires = importlib.metadata.distribution(info.distribution).requires or []
    except importlib.metadata.PackageNotFoundError:
        return ()  # registered in process, or a plugin without metadata: nothing to check
    missing = []
    for requirement in requires:
        if ";" in requirement:
            continue  # an extra or a platform's requirement
        name = re.match(r"[A-Za-z0-9._-]+", requirement.strip())
        if name is None:
            continue
        try:
            importlib.metadata.distribution(name.group(0))
        except importlib.metadata.PackageNotFoundError:
            missing.append(requirement.strip())
    return tuple(missing)


def _missing_message(act: Activation, missing: tuple[str, ...]) -> str:
    """The line naming the plugin, the keys that enabled it and the command that installs what it lacks."""
    wanted = " ".join(f"'{r}'" if any(c in r for c in "<>=!~ ") else r for r in missing)
    enabled = f" (enabled by {', '.join(act.keys)})" if act.keys else ""
    return (
        f"the plugin {act.plugin.describe()}{enabled} needs {', '.join(missing)}, which is not installed: "
        f"`pip install {wanted}`"
    )


def _conflict(role: str, first: Activation, second: Activation) -> str:
    def who(act: Activation) -> str:
        keys = ", ".join(act.keys) or "no keys named"
        return f"{act.plugin.describe()}, enabled by: {keys}"

    return (
        f"two plugins claim the role '{role}': {who(first)}; and {who(second)}. "
        f"Only one may own it in a run: remove the keys of one of them from the config."
    )
