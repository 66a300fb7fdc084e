"""Reading rows of a dataset entry: local files (jsonl, json, csv, parquet and Arrow, the last two through
pyarrow), or a Hugging Face Hub dataset loaded with `datasets` (see ``ktrain.data.hub``).

Rows are produced lazily, one at a time, each with the place it came from (file and line, file and row,
or Hub id and row), so that an error names it and a streamed dataset never sits whole in memory.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from ktrain.config.paths import looks_local
from ktrain.data import hub

SUFFIXES = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}


class DataError(Exception):
    """A dataset cannot be read or used; the message names the ``datasets[i]`` entry and the file."""


@attrs.frozen
class Row:
    """One row of a dataset file and where it is: ``place`` is ``FILE line N`` or ``FILE row N``."""

    fields: Any
    place: str


def from_hub(entry: Any) -> bool:
    """Whether ``entry.path`` is a Hugging Face Hub id (see ``looks_local``) rather than a local path."""
    return not looks_local(entry.path)


def _hub_split(entry: Any, where: str) -> Any:
    """The entry's split of its Hub dataset, a `datasets.Dataset`; an error names ``where.path``."""
    try:
        return hub.load(entry.path, entry.name, entry.split, entry.data_files)
    except hub.HubError as e:
        raise DataError(f"{where}.path: {e}") from None


def data_files(entry: Any, where: str) -> list[Path]:
    """The files of one dataset entry, in a fixed order (for a Hub dataset, the Arrow files `datasets` keeps
    its split in); an error names ``where.path`` when there are none."""
    if from_hub(entry):
        return [Path(f["filename"]) for f in _hub_split(entry, where).cache_files]
    root = Path(entry.path).expanduser()
    if not root.exists():
        raise DataError(f"{where}.path: {entry.path} does not exist (give an existing file or folder)")
    if entry.data_files:
        names = [entry.data_files] if isinstance(entry.data_files, str) else entry.data_files
        files = [root / n if root.is_dir() else Path(n).expanduser() for n in names]
    elif root.is_dir():
        found = sorted(p for p in root.rglob("*") if p.suffix in SUFFIXES and p.is_file())
        files = [p for p in found if entry.split in p.name] or found
    else:
        files = [root]
    missing = [str(f) for f in files if not f.is_file()]
    if missing or not files:
        raise DataError(f"{where}.path: no readable data file in {', '.join(missing) or entry.path}")
    return files


def _json_rows(path: Path, where: str) -> Iterator[Row]:
    with path.open(encoding="utf-8") as f:
        head = f.read(1 << 16).lstrip()
    if path.suffix == ".json" and head[:1] in "[{":
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError:
            data = None  # not one JSON document: read it as JSON lines below
        if isinstance(data, dict) and isinstance(data.get("data"), list):
            data = data["data"]
        if isinstance(data, list):
            for number, fields in enumerate(data):
                yield Row(fields, f"{path} item {number}")
            return
    with path.open(encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                fields = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{where}: {path} line {number} is not valid JSON: {e.msg}") from None
            yield Row(fields, f"{path} line {number}")


def _csv_rows(path: Path) -> Iterator[Row]:
    with path.open(newline="", encoding="utf-8") as f:
        for number, fields in enumerate(csv.DictReader(f), 2):  # line 1 is the header
            yield Row(fields, f"{path} line {number}")


def _arrow_rows(path: Path, kind: str, where: str) -> Iterator[Row]:
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(f"{where}: reading {path} needs pyarrow: `pip install pyarrow`") from None
    if kind == "parquet":
        batches = pq.ParquetFile(path).iter_batches(batch_size=1024)
    else:
        try:
            reader = pa.ipc.open_file(path)
            batches = (reader.get_batch(i) for i in range(reader.num_record_batches))
        except pa.ArrowInvalid:  # Hugging Face `datasets` writes Arrow streams, not files
            batches = pa.ipc.open_stream(path)
    number = 0
    for batch in batches:
        for fields in batch.to_pylist():
            yield Row(fields, f"{path} row {number}")
            number += 1


def _hub_rows(entry: Any, where: str) -> Iterator[Row]:
    for number, fields in enumerate(_hub_split(entry, where)):
        yield Row(fields, f"{entry.path} ({entry.split}) row {number}")


def _sources(entry: Any, where: str) -> Iterator[Iterator[Row]]:
    """The rows of each file of the entry, or of its Hub dataset."""
    if from_hub(entry):
        yield _hub_rows(entry, where)
        return
    for path in data_files(entry, where):
        kind = entry.ds_type or SUFFIXES.get(path.suffix, "json")
        if kind == "json":
            yield _json_rows(path, where)
        elif kind == "csv":
            yield _csv_rows(path)
        else:
            yield _arrow_rows(path, kind, where)


def iter_rows(entry: Any, where: str) -> Iterator[Row]:
    """Every row of one dataset entry, in file order, read lazily; rows that are not objects are an error."""
    for rows in _sources(entry, where):
        for row in rows:
            if not isinstance(row.fields, dict):
                raise DataError(f"{where}: {row.place} is a {type(row.fields).__name__}, not an object with fields")
            yield row
