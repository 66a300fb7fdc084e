"""From a YAML file to a checked run plan: plugins, structured config, roles, registries and mesh.

Used by ``ktrain check`` and by ``ktrain run`` before any rank starts; imports no torch. Every problem
ends up in one ``ConfigError`` report, each with the key it concerns.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any, Literal

from ktrain.config import fast_defaults
from ktrain.config.activation import activate, discover
from ktrain.config.axolotl import missing_optimizer
from ktrain.config.install import install_command
from ktrain.config.launch import Launch
from ktrain.config.load import Section, read_config
from ktrain.config.mesh import KERNEL_DIMS, MeshPlan, check_sizes, plan_mesh
from ktrain.config.model import Config
from ktrain.config.paths import check_paths
from ktrain.config.report import ConfigError, Report
from ktrain.config.run_plan import Plan
from ktrain.plugins import PluginError, Plugins
from ktrain.registry import collect


def load_plugins_and_config(
    path: str | Path | None, overrides: list[str], extra_plugins: Iterable[tuple[str, Any]] = ()
) -> tuple[Plugins, Config]:
    """Discover plugins, collect the config sections they declare, and structure the file.

    Raises ``ConfigError`` with every problem of the keys.
    """
    plugins, config, report, _ = _read(path, overrides, extra_plugins)
    if report.errors:
        raise ConfigError(report)
    return plugins, config


def _read(
    path: str | Path | None, overrides: list[str], extra_plugins: Iterable[tuple[str, Any]]
) -> tuple[Plugins, Config, Report, set[str]]:
    """The plugins, the config, the report of its keys' problems and the keys refused (see ``read_config``)."""
    plugins = discover(extra_plugins)
    sections: list[Section] = []

    def register(cls: type, *, plugin: Any, docs_url: str | None = None) -> None:
        sections.append(Section(cls, plugin.name))

    plugins.call_with_callback("ktrain_register_config", register=register)
    installed = {info.distribution for info in plugins.infos}
    return plugins, *read_config(path, overrides, sections, installed)


def prepare(
    path: str | Path | None,
    overrides: list[str] = (),
    *,
    world_size: int | None = None,
    device: Literal["cuda", "cpu"] | None = None,
    capability: tuple[int, int] | None = None,
    extra_plugins: Iterable[tuple[str, Any]] = (),
    with_defaults: bool = False,
    planned: bool = False,
    gpu_memory: int | None = None,
    resolved: tuple[float, str] | None = None,
) -> Plan:
    """Load, activate and check everything for a run of ``world_size`` ranks (None: what the mesh asks).

    ``device`` is the device type the ranks will use (``ktrain run`` passes it; None where it is not
    known; ``capability`` the GPUs' lowest compute capability): on ``cuda`` the keys' GPU defaults are
    resolved (``ktrain.config.fast_defaults``); with it, or with ``world_size``, plugins' checks get a
    ``Launch`` (``planned``: no rank will start from it, see ``Launch``). The problems of every stage are
    reported together: unknown keys are left out and refused values hold their defaults, and a role claimed
    twice or a plugin's missing requirement is recorded (the second claimant left out) while the plugins'
    checks, the registries and the mesh are checked. Raises ``PluginError`` when the plugins'
    activation is all that is wrong, ``ConfigError`` with every problem otherwise.

    On ``cuda``, ``gradient_checkpointing_fraction: auto`` becomes a number (``ktrain.memory.fraction``: the
    checked plan is predicted against ``gpu_memory``, None: this machine's GPUs'), and the config is planned
    again with it (``resolved``: that number and what it was chosen from), so that every plugin is built with it.
    """
    plugins, config, report, refused = _read(path, list(overrides), extra_plugins)
    config = fast_defaults.resolve(config, device, capability)  # on a GPU, before the plugins decide from it
    if resolved is not None:
        config = fast_defaults.resolved(config, "gradient_checkpointing_fraction", *resolved)
    activation_problems = activate(plugins, config, with_defaults=with_defaults)
    for key, message in activation_problems:
        report.error(key, message)
    loaded = len(report.problems)
    mesh_report = Report(config.source)
    mesh = _plan_mesh(plugins, config, world_size, mesh_report)
    launch = None
    if device is not None or world_size is not None:
        launch = Launch(
            world_size=mesh.world_size if mesh is not None else world_size,
            device=device,
            capability=capability,
            planned=planned,
        )
    plugins.hook.ktrain_validate_config(config=config, report=report, launch=launch)
    optimizers = collect(plugins, "ktrain_register_optimizers", "optimizer")
    schedulers = collect(plugins, "ktrain_register_lr_schedulers", "lr scheduler")
    formats = collect(plugins, "ktrain_register_dataset_formats", "dataset format")
    if config.optimizer not in optimizers:
        missing = missing_optimizer(config.optimizer)
        report.error("optimizer", missing or optimizers.unknown(config.optimizer, "optimizer"))
    if config.lr_scheduler not in schedulers:
        report.error("lr_scheduler", schedulers.unknown(config.lr_scheduler, "lr_scheduler"))
    for i, entry in enumerate(config.datasets):
        if entry.type is not None and entry.type not in formats:
            report.error(f"datasets[{i}].type", formats.unknown(entry.type, f"datasets[{i}].type"))
    check_paths(config, report, launching=device is not None)
    report.problems.extend(mesh_report.problems)
    report.problems[loaded:] = [p for p in report.problems[loaded:] if p.top_key not in refused]
    if activation_problems and len(report.errors) == len(activation_problems):
        raise PluginError("\n".join(message for _, message in activation_problems))  # plugins' problems alone
    if report.errors or mesh is None:
        raise ConfigError(report)
    plan = Plan(config, plugins, mesh, optimizers, schedulers, formats, report.warnings)
    if device == "cuda" and config.gradient_checkpointing and config.gradient_checkpointing_fraction == "auto":
        from ktrain.memory import fraction

        def plain() -> Plan:
            written = prepare(path, overrides, world_size=mesh.world_size, extra_plugins=extra_plugins)
            if not fraction.reads_as_pure_bf16(written.config, capability):
                return written
            return prepare(path, [*overrides, "bfloat16=true"], world_size=mesh.world_size, extra_plugins=extra_plugins)

        memory = gpu_memory if gpu_memory is not None else fraction.gpu_memory()
        value, why = fraction.resolve_auto(plan, plain, memory)
        return prepare(path, overrides, world_size=world_size, device=device, capability=capability,
                       extra_plugins=extra_plugins, with_defaults=with_defaults, planned=planned,
                       resolved=(value, why))  # fmt: skip
    return plan


def _plan_mesh(plugins: Plugins, config: Config, world_size: int | None, report: Report) -> MeshPlan | None:
    """The mesh for ``world_size`` ranks, or None with every problem of the sizes added to ``report``."""
    known_errors = len(report.errors)
    owners = plugins.role_owners()
    sizes = {dim: getattr(config, key) for dim, key in KERNEL_DIMS.items()}
    try:
        given = plugins.collect("ktrain_collect_mesh_dims", "mesh dimension", config=config)
    except PluginError as e:
        report.error("mesh", str(e))
        return None
    for dim, size in given.items():
        if dim in KERNEL_DIMS and config.is_set(KERNEL_DIMS[dim]):
            report.error(KERNEL_DIMS[dim], "mesh dimension sized twice (by its key and a plugin's key)")
        sizes[dim] = size  # a plugin's key sizes a kernel dimension whose own key is unset, or a dimension of its own
    check_sizes(sizes, report)
    sharded = not owners["sharding"].default if "sharding" in owners else False
    if (sizes["dp_shard"] > 1 or sizes["dp_shard"] == -1) and not sharded:
        report.error(
            "dp_shard_size",
            "sharding needs a sharding plugin: set fsdp_version/fsdp_config (ktrain-plugin-fsdp) or deepspeed "
            f"(ktrain-plugin-deepspeed){_install_hint(plugins, 'ktrain-plugin-fsdp', 'ktrain-plugin-deepspeed')}; "
            "for plain data parallel use dp_replicate_size",
        )
    for dim, size in sizes.items():
        if dim.startswith("dp_") or not (size > 1 or size == -1):
            continue
        if f"mesh:{dim}" not in owners:
            key = KERNEL_DIMS.get(dim, dim)
            hint = _install_hint(plugins, "ktrain-plugin-parallel") if dim in ("tp", "cp") else ""
            report.error(key, f"no active plugin parallelizes the '{dim}' dimension{hint}")
    if len(report.errors) > known_errors:
        return None
    try:
        return plan_mesh(sizes, set(config.present), world_size, sharded, config.source)
    except ConfigError as e:
        report.problems.extend(e.report.problems)
        return None


def _install_hint(plugins: Plugins, *distributions: str) -> str:
    """``; install one: `pip install ...``` for those of ``distributions`` that are not installed, else ''."""
    installed = {info.distribution for info in plugins.infos}
    commands = [f"`{install_command(d)}`" for d in distributions if d not in installed]
    return f"; to install: {' or '.join(commands)}" if commands else ""
