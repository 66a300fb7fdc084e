"""Writing files so that a reader sees the old content or the new, never half of either."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a rename or creation inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def atomic_write_text(path: Path, text: str) -> None:
    """Write ``text`` to a temporary name beside ``path``, fsync it, rename it over ``path``, fsync the folder."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_tree(root: Path) -> None:
    """fsync every file and folder under ``root`` (before it is renamed into view)."""
    for folder, _, names in os.walk(root):
        for name in names:
            with open(os.path.join(folder, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(folder))


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
