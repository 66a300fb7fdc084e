"""Finding the plugins of a command and activating them for a config: the first step of the config phase.

``discover()`` registers the kernel's own entry module, every installed ``ktrain`` entry point and the
hook specifications; ``activate()`` lets each plugin decide, from the config, whether it takes part and
which roles it claims. The kernel's defaults own the roles nobody claimed; their modules import torch, so
they are built only where a run's objects are (``with_defaults``).
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
from ktrain.config.static_hooks import implemented_hooks
from ktrain.plugins import (
    DEFAULT_OWNERS,
    KERNEL_ENTRY,
    KERNEL_INFO_NAME,
    OWNED_HOOKS,
    Activation,
    PluginError,
    PluginInfo,
    Plugins,
)


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
        if obj is not info.module:
            raise _unclaimed(info, caller.name, type(obj).__name__, role)
        module = getattr(info.module, "__name__", type(info.module).__name__)  # an object registered in process
        where = f"in its entry module {module}, which takes part in every run"
        fix = f"move it to a runtime object activated with activate(obj, roles=('{role}',))"
        raise PluginError(f"plugin {info.describe()} implements {caller.name} {where}: {fix}")


def _check_owned_hooks_of_target(info: PluginInfo, target: str, roles: tuple[str, ...]) -> None:
    """``_check_owned_hooks`` for a lazy ``"module:attribute"``, on the hooks its module's source shows."""
    for class_name, hook in implemented_hooks(target):
        role = OWNED_HOOKS.get(hook)
        if role is not None and role not in roles:
            raise _unclaimed(info, hook, class_name, role)


def _unclaimed(info: PluginInfo, hook: str, class_name: str, role: str) -> PluginError:
    return PluginError(
        f"plugin {info.describe()} implements {hook} on its runtime object {class_name} without claiming the "
        f"role '{role}': pass roles=('{role}', ...) to activate(), or remove the hook"
    )


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
    no runtime module: it reads the module's source for the role hooks the object will answer
    (``ktrain.config.static_hooks``) and refuses one whose role is not claimed. With ``with_defaults``
    the kernel's default owners (which import torch) are registered for the roles nobody claimed too.
    Returns ``(config key, message)`` for what the checks can go on after: a role claimed by a second
    plugin (both named, with their distributions, versions and keys; the second is left out) and an
    unconditional requirement of an active plugin's distribution that is not installed (with the command
    that installs it). Raises ``PluginError`` for an object that is not valid.
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
                    _check_owned_hooks_of_target(_info, obj, act.roles)
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
