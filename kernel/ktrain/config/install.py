"""The command that installs a plugin where the user is: from this checkout when there is one, else by name."""

from __future__ import annotations

import re
from pathlib import Path

import ktrain

_NAME = re.compile(r'^name\s*=\s*"([^"]+)"', re.M)


def _checkout_folders() -> dict[str, Path]:
    """Distribution name -> its folder, for the plugins of the repository the kernel runs from (editable)."""
    root = Path(ktrain.__file__).resolve().parents[2]  # <repo>/kernel/ktrain/__init__.py
    if not (root / "kernel" / "ktrain").is_dir():
        return {}
    found = {}
    for pyproject in sorted([*root.glob("plugins/*/pyproject.toml"), *root.glob("contrib/*/pyproject.toml")]):
        match = _NAME.search(pyproject.read_text(encoding="utf-8"))
        if match:
            found[match.group(1)] = pyproject.parent
    return found


def install_command(distribution: str) -> str:
    """``pip install -e <checkout>/plugins/NAME`` when the kernel runs from a checkout holding the plugin,
    else ``pip install DISTRIBUTION``."""
    folder = _checkout_folders().get(distribution)
    return f"pip install -e {folder}" if folder is not None else f"pip install {distribution}"
