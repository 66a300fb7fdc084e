"""What a checkpoint's ``manifest.json`` records, and the checks made against it before anything is read.

The manifest names every file of the checkpoint with its size and sha256. It is written last into the
staging folder, fsynced with everything else, and the folder's rename to ``step-N`` is the commit
marker: a rename is atomic, so a folder of that name exists only once every file and the manifest are
durable (``ktrain.run.checkpoints``). Before a resume or an export deserialises anything, every file
is hashed and compared: a flipped byte, a truncated, missing or replaced file (a DCP ``.metadata``
swapped for a pickle that would run code) is found here and named, and no reader ever opens it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import platform
import shutil
from pathlib import Path
from typing import Any

from ktrain.run.files import sha256_file

MANIFEST = "manifest.json"


class NoSpaceLeft(RuntimeError):
    """A checkpoint does not fit on its disk (checked before a save, or ENOSPC during one)."""


def size_of(entry: int | dict[str, Any]) -> int:
    """The size a manifest's ``files`` entry records (an int in manifests before sha256 was recorded)."""
    return entry if isinstance(entry, int) else entry["size"]


def file_table(folder: Path) -> dict[str, dict[str, Any]]:
    """``relative name -> {"size", "sha256"}`` of every file under ``folder`` (the manifest excepted)."""
    return {
        str(p.relative_to(folder)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
        for p in sorted(folder.rglob("*"))
        if p.is_file() and p.name != MANIFEST
    }


def versions() -> dict[str, str]:
    """Versions of what wrote a checkpoint: ktrain, Python, torch, transformers."""
    import torch
    import transformers

    from ktrain import __version__

    return {
        "ktrain": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
    }


def config_sha256(run_dir: Path) -> str:
    """sha256 of the run's ``config.yaml``, the keys the ranks read."""
    return hashlib.sha256((run_dir / "config.yaml").read_bytes()).hexdigest()


def read(path: Path) -> dict[str, Any] | None:
    """The manifest of ``path``, or None when it is missing, unreadable, or a listed file's size differs.

    Cheap (no hashing): for listing and pruning checkpoints. ``problem`` is the check before reading one.
    """
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except (OSError, ValueError):
        return None
    for name, entry in manifest.get("files", {}).items():
        file = path / name
        if not file.is_file() or file.stat().st_size != size_of(entry):
            return None
    return manifest


def file_problem(path: Path, name: str, entry: int | dict[str, Any]) -> str | None:
    """What is wrong with the file ``name`` of checkpoint ``path`` against its manifest entry, or None."""
    file = path / name
    if not file.is_file():
        return f"{file} is missing"
    size = file.stat().st_size
    if size != size_of(entry):
        return f"{file} has {size} bytes, the manifest says {size_of(entry)} (truncated or replaced)"
    if isinstance(entry, dict) and sha256_file(file) != entry["sha256"]:
        return f"{file} does not match its sha256 in the manifest (corrupted or replaced)"
    return None


def manifest_problem(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(manifest, None) when ``manifest.json`` of ``path`` is readable and lists hashed files, else (None, why)."""
    try:
        manifest = json.loads((path / MANIFEST).read_text())
    except OSError:
        return None, f"{path / MANIFEST} is missing"
    except ValueError:
        return None, f"{path / MANIFEST} is not valid JSON (corrupted)"
    files = manifest.get("files") if isinstance(manifest, dict) else None
    if not isinstance(files, dict) or not files:
        return None, f"{path / MANIFEST} lists no files"
    if any(not isinstance(entry, dict) or "sha256" not in entry for entry in files.values()):
        return None, f"{path / MANIFEST} has no sha256 of its files (written before ktrain verified checkpoints)"
    return manifest, None


def ensure_space(folder: Path, need: int) -> None:
    """Raise ``NoSpaceLeft`` unless the disk of ``folder`` has ``need`` bytes free."""
    have = shutil.disk_usage(folder).free
    if have < need:
        raise NoSpaceLeft(f"no space left on {folder}: need {human_size(need)}, have {human_size(have)}")


def is_no_space(error: BaseException) -> bool:
    """Whether ``error`` (or what a format library wrapped into it) is a full disk."""
    while error is not None:
        if isinstance(error, OSError) and error.errno == errno.ENOSPC:
            return True
        if "No space left on device" in str(error):
            return True
        error = error.__cause__ or error.__context__
    return False


def human_size(size: int) -> str:
    """``size`` bytes for a message: 512 bytes, 3.1 MiB."""
    value = float(size)
    for unit in ("bytes", "KiB", "MiB"):
        if value < 1024:
            return f"{size} bytes" if unit == "bytes" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{value:.1f} GiB"
