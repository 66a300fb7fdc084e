"""The value of ``deepspeed:`` read into one JSON object: a file, an inline mapping, or a preset's name.

A value that ends in ``.json``, holds a path separator or names an existing file is a path (relative to
the working directory, like every path in a ktrain config); any other string is the name of a preset
this plugin ships. Nothing here imports torch or DeepSpeed.
"""

from __future__ import annotations

import copy
import difflib
import json
import os
from pathlib import Path
from typing import Any

import attrs

from ktrain_deepspeed.presets import preset_names, preset_path


class SourceError(ValueError):
    """The ``deepspeed:`` value cannot be read; the message says what to do."""


@attrs.frozen
class Source:
    """The JSON object as written, and where it came from (for messages)."""

    settings: dict[str, Any]
    origin: str


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise SourceError(f"the key '{name}' appears twice in one object; keep one")
        out[name] = value
    return out


def is_path(value: str) -> bool:
    """Whether a ``deepspeed:`` string names a file rather than a preset."""
    return value.endswith(".json") or "/" in value or os.sep in value or os.path.isfile(value)


def read_json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``SourceError`` names the file, line and column of a syntax error."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise SourceError(f"cannot read {path}: {e}") from None
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as e:
        raise SourceError(f"{path}, line {e.lineno}, column {e.colno}: {e.msg}") from None
    except SourceError as e:
        raise SourceError(f"{path}: {e}") from None
    if not isinstance(data, dict):
        raise SourceError(f"{path} holds a JSON {type(data).__name__}, not an object ({{...}})")
    return data


def read(value: str | dict[str, Any]) -> Source:
    """Read ``deepspeed:``; raises ``SourceError`` with what to do."""
    if isinstance(value, dict):
        return Source(copy.deepcopy(value), "the inline deepspeed mapping")
    if is_path(value):
        path = Path(value).expanduser()
        if not path.is_file():
            names = ", ".join(preset_names())
            hint = (
                f"`ktrain fetch deepspeed_configs` writes the presets ({names}) into ./deepspeed_configs/, "
                f"or write `deepspeed: {path.stem}` to use the installed preset directly"
                if path.stem in preset_names()
                else f"give an existing JSON file, an inline mapping, or a preset name ({names})"
            )
            raise SourceError(f"{value} does not exist; {hint}")
        return Source(read_json(path), str(value))
    if value not in preset_names():
        close = difflib.get_close_matches(value, preset_names(), n=1)
        hint = f"did you mean '{close[0]}'? " if close else ""
        raise SourceError(
            f"'{value}' is neither a JSON file nor a preset; {hint}presets: {', '.join(preset_names())} "
            f"(a file name ends in .json)"
        )
    return Source(read_json(preset_path(value)), f"the preset {value}")
