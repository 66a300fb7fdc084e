"""The tokenized-dataset cache: Arrow files in ``dataset_prepared_path/KEY/``, memory-mapped by every rank.

``KEY`` is a hash of everything that decides the tokens: the content of every data file, the tokenizer
(vocabulary, special tokens, its own chat template), the chat templates and the keys the formats read,
and the preprocessing code (the source of the kernel's data modules, and the distribution and version
of each plugin whose format is used). Change any of them and the key changes: a miss, and a new build.
A build is written under a temporary name and renamed when complete, so a reader never sees half a cache
and two builders racing (one per machine) each produce the same folder.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

import attrs
import numpy as np

from ktrain import __version__
from ktrain.data import examples, formats, reading, templates
from ktrain.data.examples import DatasetStats, TokenTable
from ktrain.registry import Registry

STATS = "stats.json"
CODE = (formats, templates, examples, reading)


def _file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _tokenizer_identity(tokenizer: Any) -> dict[str, Any]:
    backend = getattr(tokenizer, "backend_tokenizer", None)
    return {
        "class": type(tokenizer).__name__,
        "model": backend.to_str() if backend is not None else json.dumps(tokenizer.get_vocab(), sort_keys=True),
        "special": str(tokenizer.special_tokens_map),
        "chat_template": getattr(tokenizer, "chat_template", None),
    }


def cache_key(config: Any, tokenizer: Any, formats_registry: Registry) -> str:
    """The hash naming the cache of ``datasets`` and ``test_datasets`` for this tokenizer and code."""
    import tokenizers
    import transformers

    parts: dict[str, Any] = {
        "ktrain": __version__,
        "tokenizers": tokenizers.__version__,
        "transformers": transformers.__version__,
        "code": [hashlib.sha256(Path(m.__file__).read_bytes()).hexdigest() for m in CODE],
        "tokenizer": _tokenizer_identity(tokenizer),
        "keys": {
            k: getattr(config, k)
            for k in (
                "sequence_len",
                "min_sample_len",
                "train_on_inputs",
                "chat_template",
                "eot_tokens",
                "dataset_exact_deduplication",
            )
        },
        "jinja": config.chat_template_jinja,
    }
    for key in ("datasets", "test_datasets"):
        entries = []
        for i, entry in enumerate(getattr(config, key)):
            where = f"{key}[{i}]"
            plugin = formats_registry.items[entry.type][1] if entry.type in formats_registry else None
            entries.append(
                {
                    "entry": attrs.asdict(entry),
                    "files": [_file_digest(p) for p in reading.data_files(entry, where)],
                    "format_by": f"{plugin.distribution}=={plugin.version}" if plugin else None,
                }
            )
        parts[key] = entries
    text = json.dumps(parts, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:24]


@attrs.define
class Prepared:
    """The tokenized samples of ``datasets`` (``train``) and ``test_datasets`` (``test``), with their stats."""

    train: TokenTable
    test: TokenTable | None
    stats: list[DatasetStats]


def _pyarrow() -> Any:
    try:
        import pyarrow
    except ImportError:
        raise reading.DataError("the tokenized-dataset cache is Arrow: `pip install pyarrow`") from None
    return pyarrow


def _arrow(pa: Any, values: np.ndarray, dtype: type[np.generic]) -> Any:
    """``values`` as an Arrow array of ``dtype`` over the same memory where it is contiguous and of that type.
    pyarrow's own conversion (``pa.array``) imports pandas, which tokenizing does not need (0.8 s of CPU)."""
    data = np.ascontiguousarray(values, dtype=dtype)
    return pa.Array.from_buffers(pa.from_numpy_dtype(data.dtype), len(data), [None, pa.py_buffer(data)])


def _write_table(table: TokenTable, path: Path) -> None:
    pa = _pyarrow()

    offsets = _arrow(pa, table.offsets, np.int64)
    columns = {
        "input_ids": pa.LargeListArray.from_arrays(offsets, _arrow(pa, table.ids, np.int32)),
        "labels": pa.LargeListArray.from_arrays(offsets, _arrow(pa, table.labels, np.int32)),
    }
    batch = pa.record_batch(columns)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, batch.schema) as writer:
        writer.write_batch(batch)


def _view(array: Any, dtype: type[np.generic]) -> np.ndarray:
    """``array``, an Arrow array of ``dtype`` without nulls, as a read-only NumPy array over the same memory.
    pyarrow's own ``to_numpy`` imports pandas, which nothing else in a rank needs."""
    return np.frombuffer(
        array.buffers()[1], dtype=dtype, count=len(array), offset=array.offset * np.dtype(dtype).itemsize
    )


def _read_table(path: Path) -> TokenTable:
    pa = _pyarrow()

    batch = pa.ipc.open_file(pa.memory_map(str(path), "r")).get_batch(0)
    ids, labels = batch.column("input_ids"), batch.column("labels")
    return TokenTable(_view(ids.values, np.int32), _view(labels.values, np.int32), _view(ids.offsets, np.int64))


def write(folder: Path, prepared: Prepared) -> None:
    """Write ``prepared`` as ``folder`` (atomically: a temporary folder renamed at the end)."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = folder.parent / f".tmp-{folder.name}-{os.getpid()}"
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir()
    _write_table(prepared.train, staging / "train.arrow")
    if prepared.test is not None:
        _write_table(prepared.test, staging / "test.arrow")
    stats = [attrs.asdict(s) for s in prepared.stats]
    (staging / STATS).write_text(json.dumps({"stats": stats}, indent=1), encoding="utf-8")
    try:
        staging.rename(folder)
    except OSError:  # another machine's builder finished first: same key, same content
        shutil.rmtree(staging)


def exists(folder: Path) -> bool:
    return (folder / STATS).is_file()


def read(folder: Path) -> Prepared:
    """The cache in ``folder``, memory-mapped."""
    stats = json.loads((folder / STATS).read_text(encoding="utf-8"))["stats"]
    test = folder / "test.arrow"
    return Prepared(
        _read_table(folder / "train.arrow"),
        _read_table(test) if test.exists() else None,
        [DatasetStats(**s) for s in stats],
    )


def build(config: Any, tokenizer: Any, formats_registry: Registry, strict: bool = True) -> Prepared:
    """Tokenize ``datasets`` and ``test_datasets`` (not ``pretraining_dataset``, which streams)."""
    train, stats = (
        examples.tokenize_entries(config.datasets, "datasets", tokenizer, formats_registry, config, strict)
        if config.datasets
        else (TokenTable(np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(1, np.int64)), [])
    )
    test = None
    if config.test_datasets:
        test, more = examples.tokenize_entries(
            config.test_datasets, "test_datasets", tokenizer, formats_registry, config, strict
        )
        stats += more
    return Prepared(train, test, stats)
