"""Text that ``ktrain check``, ``keys``, ``plugins`` and ``hooks`` print."""

from __future__ import annotations

import inspect

import attrs

from ktrain import hookspecs
from ktrain.config import fast_defaults
from ktrain.config.model import Config
from ktrain.config.paths import hub_datasets, hub_models
from ktrain.config.plan import Plan
from ktrain.plugins import DEFAULT_OWNERS, KERNEL_INFO_NAME, Plugins


def _value(value: object) -> str:
    text = repr(value) if not attrs.has(type(value)) else str(attrs.asdict(value))
    return text if len(text) <= 70 else text[:67] + "..."


def describe_plan(plan: Plan, every_key: bool = False) -> str:
    """The resolved config (value, owner, origin), the active plugins with their roles, and the mesh."""
    config = plan.config
    shown = sorted(config.owners) if every_key else sorted(config.present | config.unset)
    title = "every key" if every_key else "keys set (--all shows every key)"
    lines = [f"config {config.source}: OK", "", f"{title} (value, owner, from):"]
    for key in shown:
        if key in config.owners:
            lines.append(f"  {key} = {_value(getattr(config, key))}    [{config.owners[key]}; {config.origins[key]}]")
        else:  # written as null, and no installed plugin declares it
            lines.append(f"  {key}    [no installed plugin; {config.origins[key]}]")
    hub = hub_models(config)
    if hub:
        lines += ["", "from the Hugging Face Hub when the run loads the model (not contacted by check):"]
        lines += [f"  {line}" for line in hub]
    hub = hub_datasets(config)
    if hub:
        lines += ["", "datasets from the Hugging Face Hub (not contacted by check):"]
        lines += [f"  {line}" for line in hub]
    lines += ["", "plugins in this run (roles):"]
    for act in plan.plugins.activations:
        who = act.plugin.describe() if not act.default else f"kernel default {act.obj}"
        roles = ", ".join(act.roles) or "-"
        keys = f"; enabled by {', '.join(act.keys)}" if act.keys else ""
        lines.append(f"  {roles}: {who}{keys}")
    lines += ["", f"mesh: {plan.mesh.describe()}"]
    lines += _describe_fast_defaults(config)
    for problem in plan.warnings:
        lines.append(f"warning: {problem}")
    return "\n".join(lines)


def _describe_fast_defaults(config: Config) -> list[str]:
    """The keys a GPU run of ``config`` sets to its fast defaults (``ktrain.config.fast_defaults``), one a line."""
    choices = fast_defaults.applied(config) or fast_defaults.pending(config)
    if not choices:
        return ["", "fast defaults on a GPU: none (every fast path is written, switched off, or does not apply)"]
    lines = ["", "fast defaults on a GPU (a CPU run keeps the keys as written):"]
    return lines + [f"  {choice.line()}" for choice in choices]


def describe_keys(config: Config, names: dict[str, list[str]]) -> str:
    """Every key, grouped by owner (the kernel first, then plugins by name) and section, with its default and
    help; a key in ``names`` (``optimizer``, ``lr_scheduler``) lists the names plugins registered for it."""
    lines = []
    sections = [s for s in config.sections.values() if attrs.fields(type(s))]
    owner = {id(s): config.owners[attrs.fields(type(s))[0].name] for s in sections}
    sections.sort(key=lambda s: (owner[id(s)] != KERNEL_INFO_NAME, owner[id(s)]))  # stable: sections in order
    for section in sections:
        lines.append(f"{type(section).__name__} ({owner[id(section)]}):")
        for f in attrs.fields(type(section)):
            lines.append(f"  {f.name} = {_value(getattr(section, f.name))}    {f.metadata.get('help', '')}")
            if f.name in names:
                lines.append(f"    one of: {', '.join(names[f.name])}")
    return "\n".join(lines)


def describe_plugins(plugins: Plugins) -> str:
    """Installed plugins: name, distribution, version, the hooks of their entry module."""
    lines = []
    for info in plugins.infos:
        hooks = sorted(
            name for name in dir(info.module) if name.startswith("ktrain_") and callable(getattr(info.module, name))
        )
        lines.append(f"{info.name}: {info.distribution} {info.version} ({info.module.__name__})")
        lines.append(f"  hooks: {', '.join(hooks) or '-'}")
        roles = getattr(info.module, "KTRAIN_ROLES", ())
        if roles:
            lines.append(f"  roles it can claim: {', '.join(roles)}")
    lines.append("kernel defaults, for roles no plugin claims:")
    lines += [f"  {role}: {target}" for role, target in DEFAULT_OWNERS.items()]
    return "\n".join(lines)


def hook_signature(name: str) -> str:
    """``name(arg, ...)`` as a plugin author writes it; docs/hooks.md must show exactly this."""
    params = inspect.signature(getattr(hookspecs, name)).parameters
    return f"{name}({', '.join(params)})"


def hook_names() -> list[str]:
    return [name for name in vars(hookspecs) if name.startswith("ktrain_")]


def describe_hooks() -> str:
    """Every hook with its signature and the first line of its docstring."""
    lines = []
    for name in hook_names():
        doc = (getattr(hookspecs, name).__doc__ or "").strip().splitlines()[0]
        lines.append(f"{hook_signature(name)}\n    {doc}")
    return "\n".join(lines)
