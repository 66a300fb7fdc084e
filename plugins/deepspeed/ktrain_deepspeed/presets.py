"""The DeepSpeed presets this plugin ships, and ``ktrain fetch deepspeed_configs [DIR]`` that copies them.

The presets are package data (``ktrain_deepspeed/presets/*.json``), so a fetch is offline and always
matches the installed version. ``deepspeed: zero2`` uses a preset without fetching it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import sys
from pathlib import Path

PRESET_DIR = Path(__file__).parent / "presets"
DEFAULT_DIR = "deepspeed_configs"
DISTRIBUTION = "ktrain-plugin-deepspeed"


def preset_names() -> list[str]:
    """Names of the installed presets (the file names without ``.json``)."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def preset_path(name: str) -> Path:
    return PRESET_DIR / f"{name}.json"


def configure(parser: argparse.ArgumentParser) -> None:
    """Arguments of ``ktrain fetch``."""
    parser.add_argument("what", choices=["deepspeed_configs"], help="what to fetch: deepspeed_configs")
    parser.add_argument("dir", nargs="?", default=DEFAULT_DIR, help=f"folder to write (default: ./{DEFAULT_DIR})")
    parser.add_argument("--overwrite", action="store_true", help="replace files that differ from the presets")


def run(args: argparse.Namespace) -> int:
    """Copy every preset into ``args.dir``; refuse (exit 2) to replace an edited file without --overwrite."""
    target = Path(args.dir)
    if target.exists() and not target.is_dir():
        print(f"ktrain: fetch: {target} is a file, not a folder", file=sys.stderr)
        return 2
    presets = {name: preset_path(name).read_bytes() for name in preset_names()}
    edited = [
        f"{name}.json"
        for name, data in presets.items()
        if (target / f"{name}.json").exists() and (target / f"{name}.json").read_bytes() != data
    ]
    if edited and not args.overwrite:
        print(
            f"ktrain: fetch: {', '.join(edited)} in {target} differ from the presets; nothing written. "
            f"Keep your edits under another name, or pass --overwrite",
            file=sys.stderr,
        )
        return 2
    target.mkdir(parents=True, exist_ok=True)
    for name, data in presets.items():
        (target / f"{name}.json").write_bytes(data)
    version = importlib.metadata.version(DISTRIBUTION)
    print(f"wrote {len(presets)} presets of {DISTRIBUTION} {version} to {target}/: {', '.join(presets)}")
    return 0
