"""``ktrain migrate CONFIG``: an FSDP1 config rewritten for FSDP2, comments and key order kept, the diff shown.

Each FSDP1 key of ``fsdp_config`` (and the older ``fsdp:`` list) becomes its FSDP2 spelling in place;
keys with no FSDP2 meaning are removed, each with the reason; HYBRID_SHARD becomes ``dp_replicate_size``
(given with ``--dp-replicate-size`` unless the file sets it). A value FSDP2 cannot express (NO_SHARD)
stops the command with exit code 2 and writes nothing.
"""

from __future__ import annotations

import argparse
import difflib
import io
import os
import sys
from pathlib import Path
from typing import Any

from ktrain_fsdp.migration import NO_FSDP2_MEANING, change_of, is_fsdp1_key, list_form

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``ktrain migrate``."""
    parser.add_argument("config", help="YAML run config written for FSDP1 (fsdp_version: 1, fsdp_* keys)")
    parser.add_argument("--output", help="file to write (default: CONFIG itself)")
    parser.add_argument("--dry-run", action="store_true", help="show the difference, write nothing")
    parser.add_argument(
        "--dp-replicate-size", type=int, help="replicas, for a HYBRID_SHARD config (shards inside a replica)"
    )


def _rename(mapping: Any, old: str, new: str, value: Any) -> None:
    """Replace ``old`` by ``new: value`` at the same place in a ruamel mapping, keeping its comment."""
    position = list(mapping).index(old)
    comment = mapping.ca.items.pop(old, None)
    del mapping[old]
    mapping.insert(position, new, value)
    if comment is not None:
        mapping.ca.items[new] = comment


def migrate(data: Any, replicas: int | None) -> tuple[list[str], list[str]]:
    """Rewrite the ruamel mapping ``data`` in place; return (notes, errors)."""
    from ruamel.yaml.comments import CommentedMap

    notes: list[str] = []
    errors: list[str] = []
    section = data.get("fsdp_config")
    if section is None:
        section = CommentedMap()
    if "fsdp" in data:
        listed, unknown = list_form(data["fsdp"])
        errors += [f"fsdp: unknown item {item!r}" for item in unknown]
        for name, value in listed.items():
            section.setdefault(name, value)
        del data["fsdp"]
        notes.append("fsdp: the list form is now fsdp_config keys")
    for name in [k for k in ("fsdp_version", "version") if k in section]:  # Axolotl's places for the version
        inner = section.pop(name)
        if "fsdp_version" in data and data["fsdp_version"] != inner:
            errors.append(f"fsdp_config.{name} is {inner} but fsdp_version is {data['fsdp_version']}; keep one")
        notes.append(f"fsdp_config.{name}: moved to the top level")
    if data.get("fsdp_version") == 2 and not any(is_fsdp1_key(k) for k in section):
        return notes, errors
    if "fsdp_config" not in data:
        data["fsdp_config"] = section
    for name in [k for k in section if is_fsdp1_key(k)]:
        change = change_of(name, section[name])
        if name in NO_FSDP2_MEANING:
            del section[name]
            notes.append(f"fsdp_config.{name}: removed, it has no FSDP2 meaning ({NO_FSDP2_MEANING[name]})")
            continue
        if change.error:
            errors.append(f"fsdp_config.{name}: {change.error}")
            continue
        (new, value), *_ = change.fsdp_config.items()
        if new in section and section[new] != value:
            errors.append(f"fsdp_config.{name} says {new}: {value} but fsdp_config.{new} is {section[new]}; keep one")
            continue
        if new in section:
            del section[name]
        else:
            _rename(section, name, new, value)
        notes.append(f"fsdp_config.{name} -> {change.spelling()}")
        if change.needs_replicas and not isinstance(data.get("dp_replicate_size"), int):
            if replicas is None:
                errors.append(
                    f"fsdp_config.{name}: HYBRID_SHARD becomes a replicate dimension; give --dp-replicate-size N "
                    "(the number of replicas)"
                )
            else:
                data.insert(list(data).index("fsdp_config"), "dp_replicate_size", replicas)
    if "fsdp_version" in data:
        data["fsdp_version"] = 2
    else:
        data.insert(list(data).index("fsdp_config"), "fsdp_version", 2)
    notes.append("fsdp_version: 2")
    return notes, errors


def _yaml_like(text: str) -> Any:
    """A round-trip YAML whose list indentation is the file's own, so only migrated lines change."""
    from ruamel.yaml import YAML

    for sequence, offset in ((4, 2), (2, 0), (2, 2), (4, 0)):
        yaml = YAML()
        yaml.preserve_quotes = True
        yaml.width = 4096
        yaml.indent(mapping=2, sequence=sequence, offset=offset)
        out = io.StringIO()
        yaml.dump(yaml.load(text), out)
        if out.getvalue() == text:
            return yaml
    return yaml


def run(args: argparse.Namespace) -> int:
    """Migrate ``args.config``; print the notes and the unified diff; exit 2 on what cannot be migrated."""
    source = Path(args.config)
    try:
        text = source.read_text(encoding="utf-8")
    except OSError as e:
        print(f"ktrain: CONFIG: cannot read {source}: {e.strerror}", file=sys.stderr)
        return EXIT_BAD_INPUT
    yaml = _yaml_like(text)
    data = yaml.load(text)
    if not hasattr(data, "insert"):
        print(f"ktrain: CONFIG: {source} is not a mapping of keys", file=sys.stderr)
        return EXIT_BAD_INPUT
    notes, errors = migrate(data, args.dp_replicate_size)
    if errors:
        print(f"ktrain: {len(errors)} problem(s) in {source}; nothing written:", file=sys.stderr)
        for error in errors:
            print(f"  - {error}", file=sys.stderr)
        return EXIT_BAD_INPUT
    out = io.StringIO()
    yaml.dump(data, out)
    migrated = out.getvalue()
    target = Path(args.output) if args.output else source
    if migrated == text:
        print(f"{source} is already an FSDP2 config; nothing to change")
        return EXIT_OK
    for note in notes:
        print(f"migrated: {note}")
    sys.stdout.writelines(
        difflib.unified_diff(text.splitlines(True), migrated.splitlines(True), str(source), str(target))
    )
    if not args.dry_run:
        staging = target.with_name(f".{target.name}.tmp")
        staging.write_text(migrated, encoding="utf-8")
        os.replace(staging, target)
        print(f"written to {target}")
    return EXIT_OK
