"""From a YAML file to a checked run plan: plugins, structured config, roles, registries and mesh.

Used by ``ktrain check`` and by ``ktrain run`` before any rank starts; imports no torch. Every problem
ends up in one ``ConfigError`` report, each with the key it concerns.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs

from ktrain.config.load import Section, load_config
from ktrain.config.model import Config
from ktrain.config.report import ConfigError, Problem, Report
from ktrain.mesh import KERNEL_DIMS, MeshPlan, check_sizes, plan_mesh
from ktrain.plugins import Plugins, activate, discover
from ktrain.registry import Registry, collect


@attrs.define
class Plan:
    """Everything decided before a rank starts."""

    config: Config
    plugins: Plugins
    mesh: MeshPlan
    optimizers: Registry
    schedulers: Registry
    formats: Registry
    warnings: list[Problem]


def load_plugins_and_config(
    path: str | Path | None, overrides: list[str], extra_plugins: Iterable[tuple[str, Any]] = ()
) -> tuple[Plugins, Config]:
    """Discover plugins, collect the config sections they declare, and structure the file."""
    plugins = discover(extra_plugins)
    sections: list[Section] = []

    def register(cls: type, *, plugin: Any, docs_url: str | None = None) -> None:
        sections.append(Section(cls, plugin.name))

    plugins.call_with_callback("ktrain_register_config", register=register)
    installed = {info.distribution for info in plugins.infos}
    return plugins, load_config(path, overrides, sections, installed)


def prepare(
    path: str | Path | None,
    overrides: list[str] = (),
    *,
    world_size: int | None = None,
    extra_plugins: Iterable[tuple[str, Any]] = (),
    with_defaults: bool = False,
) -> Plan:
    """Load, activate and check everything for a run of ``world_size`` ranks (None: what the mesh asks)."""
    plugins, config = load_plugins_and_config(path, list(overrides), extra_plugins)
    activate(plugins, config, with_defaults=with_defaults)
    report = Report(config.source)
    plugins.hook.ktrain_validate_config(config=config, report=report)
    optimizers = collect(plugins, "ktrain_register_optimizers", "optimizer")
    schedulers = collect(plugins, "ktrain_register_lr_schedulers", "lr scheduler")
    formats = collect(plugins, "ktrain_register_dataset_formats", "dataset format")
    if config.optimizer not in optimizers:
        report.error("optimizer", optimizers.unknown(config.optimizer, "optimizer"))
    if config.lr_scheduler not in schedulers:
        report.error("lr_scheduler", schedulers.unknown(config.lr_scheduler, "lr_scheduler"))
    for i, entry in enumerate(config.datasets):
        if entry.type is not None and entry.type not in formats:
            report.error(f"datasets[{i}].type", formats.unknown(entry.type, f"datasets[{i}].type"))
    _check_paths(config, report)
    mesh = _plan_mesh(plugins, config, world_size, report)
    if report.errors or mesh is None:
        raise ConfigError(report)
    return Plan(config, plugins, mesh, optimizers, schedulers, formats, report.warnings)


def looks_local(name: str) -> bool:
    """A model or dataset name is a local path when it starts like one or exists; else a hub id."""
    return name.startswith((".", "/", "~")) or os.path.exists(name) or name.count("/") > 1


def _exists(path: str) -> bool:
    """Whether ``path`` exists; False (not an OSError) for names too long or with a NUL byte."""
    return os.path.exists(os.path.expanduser(path))


def _check_paths(config: Config, report: Report) -> None:
    for key in ("base_model", "base_model_config", "tokenizer_config"):
        value = getattr(config, key)
        if value and looks_local(value) and not _exists(value):
            report.error(key, f"{value} does not exist; give a local model folder or a hub id")
    if not config.base_model and not config.base_model_config:
        report.error("base_model", "required: a local HF model folder or a hub id")
    for i, entry in enumerate(config.datasets):
        if entry.path and looks_local(entry.path) and not _exists(entry.path):
            report.error(f"datasets[{i}].path", f"{entry.path} does not exist")
    if config.exact_match_eval and not os.path.isfile(config.exact_match_eval):
        report.error("exact_match_eval", f"{config.exact_match_eval} is not a file")
    out = Path(config.output_dir).expanduser().absolute()
    existing = next((p for p in (out, *out.parents) if os.path.exists(p)), None)
    if existing is not None and (not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK)):
        report.error("output_dir", f"{config.output_dir} cannot be written ({existing} is not a writable folder)")


def _plan_mesh(plugins: Plugins, config: Config, world_size: int | None, report: Report) -> MeshPlan | None:
    """The mesh for ``world_size`` ranks, or None with every problem of the sizes added to ``report``."""
    known_errors = len(report.errors)
    owners = plugins.role_owners()
    sizes = {dim: getattr(config, key) for dim, key in KERNEL_DIMS.items()}
    sized_by_plugin: set[str] = set()
    for result in plugins.hook.ktrain_collect_mesh_dims(config=config):
        for dim, size in (result or {}).items():
            if dim in KERNEL_DIMS and not config.is_set(KERNEL_DIMS[dim]) and dim not in sized_by_plugin:
                sized_by_plugin.add(dim)  # a plugin's key sizes a kernel dimension whose own key is unset
            elif dim in sizes:
                report.error(KERNEL_DIMS.get(dim, dim), "mesh dimension sized twice (by its key and a plugin's key)")
            sizes[dim] = size
    check_sizes(sizes, report)
    sharded = not owners["sharding"].default if "sharding" in owners else False
    if (sizes["dp_shard"] > 1 or sizes["dp_shard"] == -1) and not sharded:
        report.error(
            "dp_shard_size",
            "sharding needs a sharding plugin: set fsdp_version/fsdp_config (ktrain-plugin-fsdp) or deepspeed "
            "(ktrain-plugin-deepspeed); for plain data parallel use dp_replicate_size",
        )
    for dim, size in sizes.items():
        if dim.startswith("dp_") or not (size > 1 or size == -1):
            continue
        if f"mesh:{dim}" not in owners:
            key = KERNEL_DIMS.get(dim, dim)
            report.error(key, f"no active plugin parallelizes the '{dim}' dimension; install ktrain-plugin-parallel")
    if len(report.errors) > known_errors:
        return None
    try:
        return plan_mesh(sizes, set(config.present), world_size, sharded, config.source)
    except ConfigError as e:
        report.problems.extend(e.report.problems)
        return None
