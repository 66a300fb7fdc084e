"""Reading rows from local files: jsonl, json, csv, and parquet (with pyarrow installed)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


class DataError(Exception):
    """A dataset cannot be read; the message names the ``datasets[i]`` entry and the file."""


def _files(entry: Any, where: str) -> list[Path]:
    root = Path(entry.path).expanduser()
    if not root.exists():
        raise DataError(f"{where}.path: {entry.path} does not exist (datasets from a hub need the network)")
    if entry.data_files:
        names = [entry.data_files] if isinstance(entry.data_files, str) else entry.data_files
        files = [root / n if root.is_dir() else Path(n) for n in names]
    elif root.is_dir():
        files = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and entry.split in p.name)
        if not files:
            files = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES)
    else:
        files = [root]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise DataError(f"{where}: no readable data file ({', '.join(missing) or entry.path})")
    return files


def _read_json(path: Path, where: str) -> list[dict]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".json" and text.lstrip()[:1] in "[{":
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = None
        if isinstance(data, list):
            return data
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            return data["data"]
    rows = []
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise DataError(f"{where}: {path} line {number} is not JSON: {e.msg}") from None
    return rows


def _read_parquet(path: Path, where: str) -> list[dict]:
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{where}: reading {path} needs pyarrow: `pip install pyarrow`") from None
    return pq.read_table(path).to_pylist()


def read_rows(entry: Any, where: str) -> list[dict]:
    """All rows of one ``datasets:`` entry, in file order."""
    rows: list[dict] = []
    for path in _files(entry, where):
        kind = entry.ds_type or SUFFIXES.get(path.suffix, "json")
        if kind == "json":
            rows += _read_json(path, where)
        elif kind == "csv":
            with path.open(newline="", encoding="utf-8") as f:
                rows += list(csv.DictReader(f))
        elif kind == "parquet":
            rows += _read_parquet(path, where)
        else:
            raise DataError(f"{where}.ds_type: {kind} files are not readable yet; convert to jsonl or parquet")
    bad = next((i for i, r in enumerate(rows) if not isinstance(r, dict)), None)
    if bad is not None:
        raise DataError(f"{where}: row {bad} is a {type(rows[bad]).__name__}, not an object with fields")
    return rows
