"""From a YAML file and ``--set`` overrides to a structured ``Config``, with every problem in one report."""

from __future__ import annotations

import difflib
from pathlib import Path
from typing import Any

import attrs

from ktrain.config.axolotl import sift
from ktrain.config.axolotl_keys import TOP_LEVEL
from ktrain.config.converter import make_converter, report_errors, written
from ktrain.config.install import install_command
from ktrain.config.keys import PLUGIN_KEYS
from ktrain.config.model import Config
from ktrain.config.report import ConfigError, Report
from ktrain.config.yaml_io import load_yaml, parse_scalar


@attrs.frozen
class Section:
    """A registered attrs class of top-level keys and the plugin that owns them."""

    cls: type
    owner: str


def apply_override(data: dict[str, Any], assignment: str) -> str:
    """Apply one ``--set a.b.c=value`` (list items by index: ``datasets.0.path=x``); return the top key."""
    name, sep, text = assignment.partition("=")
    parts = name.strip().split(".")
    if not sep or not all(parts):
        raise ConfigError.single("--set", f"{assignment!r} is not KEY=VALUE (nested keys with dots: a.b=1)")
    node: Any = data
    for i, part in enumerate(parts[:-1]):
        if isinstance(node, list):
            if not part.isdigit() or int(part) >= len(node):
                raise ConfigError.single("--set", f"{name}: {'.'.join(parts[: i + 1])} is not an item of the list")
            node = node[int(part)]
        else:
            node = node.setdefault(part, {})
        if not isinstance(node, (dict, list)):
            raise ConfigError.single("--set", f"{name}: {'.'.join(parts[: i + 1])} holds a value, not keys")
    value = parse_scalar(text)
    last = parts[-1]
    if isinstance(node, list):
        if not last.isdigit() or int(last) >= len(node):
            raise ConfigError.single("--set", f"{name}: {last} is not an item of the list")
        node[int(last)] = value
    else:
        node[last] = value
    return parts[0]


def load_config(
    path: str | Path | None, overrides: list[str], sections: list[Section], installed: set[str] | None = None
) -> Config:
    """Read ``path`` (None: an empty config), apply ``overrides``, structure every section.

    Raises ``ConfigError`` with every problem found: unknown keys (with a "did you mean"), keys of
    plugins that are not installed (naming what to install), wrong types and values, each with its
    key path.
    """
    config, report, _ = read_config(path, overrides, sections, installed)
    if report.errors:
        raise ConfigError(report)
    return config


def read_config(
    path: str | Path | None, overrides: list[str], sections: list[Section], installed: set[str] | None = None
) -> tuple[Config, Report, set[str]]:
    """Like ``load_config``, but the key problems are returned, not raised, so that later checks still run.

    Axolotl's keys that no section owns get a note or a refusal (``ktrain.config.axolotl``).
    Returns the config, the report of its problems, and the top-level keys whose value was refused (a
    wrong type or value): they hold their default, and later stages' problems about them are noise. An
    unknown key, or one of a plugin that is not installed, is left out. A key written as null (an
    empty value) holds its default and is not *present*, also when no installed plugin declares it.
    Only problems of the file itself (missing, not YAML, a bad ``--set``) raise ``ConfigError``.
    """
    source = str(path) if path is not None else "--set"
    data, lines = load_yaml(Path(path)) if path is not None else ({}, {})
    origins = {k: f"{source}:{line}" for k, line in lines.items()}
    for assignment in overrides:
        top = apply_override(data, assignment)
        origins[top] = "--set"
    report = Report(source)
    owner_of: dict[str, Section] = {}
    for section in sections:
        for f in attrs.fields(section.cls):
            if f.name in owner_of and owner_of[f.name].owner != section.owner:
                report.error(f.name, f"declared by two plugins, '{owner_of[f.name].owner}' and '{section.owner}'")
            owner_of[f.name] = section
    parts: dict[type, dict[str, Any]] = {s.cls: {} for s in sections}
    missing: dict[str, list[str]] = {}
    unset = {name for name, value in data.items() if isinstance(name, str) and value is None}
    data = sift(data, {name: s.cls for name, s in owner_of.items()}, report, installed or set())
    for name, value in written(data).items():
        if not isinstance(name, str):
            report.error(str(name), "keys must be strings")
        elif name in owner_of:
            parts[owner_of[name].cls][name] = value
        elif (dist := _missing_plugin(name, installed or set())) is not None:
            missing.setdefault(dist, []).append(name)
        else:
            report.error(name, _unknown_key_message(name, [*owner_of, *TOP_LEVEL]))
    for dist, names in missing.items():
        hint = install_command(dist)
        report.error(", ".join(names), f"belong to the plugin {dist}, which is not installed: `{hint}`")
    converter = make_converter()
    structured: dict[type, Any] = {}
    refused: set[str] = set()
    for cls, part in parts.items():
        try:
            structured[cls] = converter.structure(part, cls)
        except Exception as e:
            before = len(report.problems)
            report_errors(e, "", cls, report)
            bad = {p.top_key for p in report.problems[before:]}
            structured[cls] = _with_defaults(converter, cls, part, bad)
            refused |= bad
    for name in owner_of:
        origins.setdefault(name, "default")
    for name in unset:
        origins[name] = f"{origins.get(name, source)}, null: unset"
    config = Config(
        sections=structured,
        owners={name: s.owner for name, s in owner_of.items()},
        present=frozenset(k for k in written(data) if isinstance(k, str)),
        origins=origins,
        source=source,
        unset=frozenset(unset),
    )
    return config, report, refused


def _with_defaults(converter: Any, cls: type, part: dict[str, Any], refused: set[str]) -> Any:
    """The section with its refused keys at their defaults, so that the checks of later stages can run."""
    try:
        return converter.structure({k: v for k, v in part.items() if k not in refused}, cls)
    except Exception:  # a problem that names no key: every key of the section at its default
        refused |= set(part)
        return converter.structure({}, cls)


def _missing_plugin(name: str, installed: set[str]) -> str | None:
    """The first-party distribution that owns ``name`` when it is not installed."""
    return next((dist for dist, keys in PLUGIN_KEYS.items() if name in keys and dist not in installed), None)


def _unknown_key_message(name: str, known: list[str]) -> str:
    close = difflib.get_close_matches(name, known, n=1, cutoff=0.7)
    hint = f"; did you mean '{close[0]}'?" if close else "; `ktrain keys` lists every key"
    return f"unknown key{hint}"
