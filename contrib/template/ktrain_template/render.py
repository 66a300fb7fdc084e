"""Rendering the skeleton: each ``*.tmpl`` file with its ``{{placeholder}}`` names filled in.

For ``ktrain new-plugin my-sink``: the distribution ``ktrain-plugin-my-sink``, the package
``ktrain_my_sink``, the config key ``my_sink`` and the class names ``MySink...``.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

SKELETON = Path(__file__).parent / "skeleton"
NAME = re.compile(r"[a-z][a-z0-9]*(?:[-_][a-z0-9]+)*")


def names(name: str) -> dict[str, str]:
    """The placeholders of plugin ``name`` (lower-case words joined by ``-`` or ``_``)."""
    words = re.split(r"[-_]", name)
    return {
        "name": "-".join(words),
        "key": "_".join(words),
        "package": "ktrain_" + "_".join(words),
        "distribution": "ktrain-plugin-" + "-".join(words),
        "class": "".join(w.capitalize() for w in words),
    }


def render(name: str, folder: Path) -> list[Path]:
    """Write the plugin package ``name`` into the new folder ``folder``; return the files written."""
    values = names(name)
    written = []
    for template in sorted(SKELETON.rglob("*.tmpl")):
        relative = template.relative_to(SKELETON).with_suffix("")
        parts = [values["package"] if part == "package" else part for part in relative.parts]
        target = folder.joinpath(*parts)
        target = target.with_name(target.name.replace("NAME", values["key"]))
        text = template.read_text(encoding="utf-8")
        for placeholder, value in values.items():
            text = text.replace("{{" + placeholder + "}}", value)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text, encoding="utf-8")
        written.append(target)
    return written


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``ktrain new-plugin``."""
    parser.add_argument("name", help="the plugin's name: lower-case words joined by - or _ (my-sink)")
    parser.add_argument("--output", help="folder to create (default: ./ktrain-plugin-NAME)")


def run(args: argparse.Namespace) -> int:
    """Write the package; exit code 2 with a message for a bad name or an existing folder."""
    if not NAME.fullmatch(args.name):
        print(
            f"ktrain new-plugin: '{args.name}' is not a plugin name: use lower-case letters and digits, "
            "words joined by - or _ (for example my-sink)",
            file=sys.stderr,
        )
        return 2
    folder = Path(args.output or f"ktrain-plugin-{names(args.name)['name']}")
    if folder.exists():
        print(f"ktrain new-plugin: {folder} exists; choose another --output", file=sys.stderr)
        return 2
    render(args.name, folder)
    print(f"wrote {folder}: next, `pip install -e {folder}` and `pytest {folder}`")
    return 0
