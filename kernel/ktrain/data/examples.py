"""Tokenizing dataset entries into samples: the samples themselves, a flat table of them, and what was dropped.

Every problem names the ``datasets[i]`` entry, the sample's index in it and its file and line. In
``strict`` mode (a run) the first problem stops; otherwise (``ktrain preprocess --check-only``) problems
are counted and the first few kept, so one pass reports all there is to fix.
"""

from __future__ import annotations

import array
import hashlib
import random
from collections.abc import Sequence
from typing import Any

import attrs
import numpy as np

from ktrain.data import templates
from ktrain.data.formats import IGNORE, pretokenized
from ktrain.data.reading import DataError, iter_rows
from ktrain.registry import Registry

KEEP_PROBLEMS = 5


@attrs.define
class Example:
    """One tokenized sample; ``labels`` is -100 where no loss is taken."""

    input_ids: Sequence[int]
    labels: Sequence[int]

    @property
    def trained_tokens(self) -> int:
        """Label tokens that count in the loss after the model's shift by one."""
        return int(np.count_nonzero(np.asarray(self.labels[1:]) != IGNORE))


class TokenTable:
    """Samples stored flat: all ``ids`` and ``labels`` end to end, sample ``i`` at ``offsets[i]:offsets[i+1]``.

    The arrays may be memory-mapped from the cache, so every rank of a machine shares one copy.
    """

    def __init__(self, ids: np.ndarray, labels: np.ndarray, offsets: np.ndarray):
        self.ids, self.labels, self.offsets = ids, labels, offsets

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> Example:
        a, b = self.offsets[i], self.offsets[i + 1]
        return Example(self.ids[a:b], self.labels[a:b])

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    def trained(self) -> np.ndarray:
        """Trained tokens of every sample (labels other than -100, the first token of each excluded)."""
        mask = self.labels != IGNORE
        mask[self.offsets[:-1]] = False  # samples are never empty
        return np.add.reduceat(mask, self.offsets[:-1]) if len(self) else np.zeros(0, dtype=np.int64)


class TableBuilder:
    """Collects samples into the flat arrays of a ``TokenTable`` without a Python list per sample."""

    def __init__(self, deduplicate: bool = False) -> None:
        self.ids, self.labels, self.offsets = array.array("i"), array.array("i"), array.array("q", [0])
        self.seen: set[bytes] | None = set() if deduplicate else None

    def is_new(self, ids: Sequence[int], labels: Sequence[int]) -> bool:
        """False for a sample whose tokens and labels an earlier sample had, when deduplicating."""
        if self.seen is None:
            return True
        digest = hashlib.sha256(array.array("i", [*ids, -1, *labels]).tobytes()).digest()
        if digest in self.seen:
            return False
        self.seen.add(digest)
        return True

    def add(self, ids: Sequence[int], labels: Sequence[int]) -> None:
        self.ids.extend(ids)
        self.labels.extend(labels)
        self.offsets.append(len(self.ids))

    def table(self) -> TokenTable:
        return TokenTable(
            np.frombuffer(self.ids, dtype=np.int32),
            np.frombuffer(self.labels, dtype=np.int32),
            np.frombuffer(self.offsets, dtype=np.int64),
        )


@attrs.define
class DatasetStats:
    """What one dataset entry gave: samples read, kept, and why the others were not."""

    where: str
    type: str
    samples: int = 0
    kept: int = 0
    invalid: int = 0
    empty: int = 0
    untrained: int = 0
    truncated: int = 0
    short: int = 0
    duplicates: int = 0
    problems: list[str] = attrs.field(factory=list)

    def describe(self) -> str:
        return (
            f"{self.where} ({self.type}): {self.samples} samples, {self.kept} kept; {self.truncated} truncated to "
            f"sequence_len, {self.untrained} without a trained token, {self.empty} empty, {self.invalid} invalid"
            + (f", {self.short} shorter than min_sample_len" if self.short else "")
            + (f", {self.duplicates} duplicates" if self.duplicates else "")
        )


def tokenize_entry(
    entry: Any, where: str, tokenizer: Any, formats: Registry, config: Any, builder: TableBuilder, strict: bool
) -> DatasetStats:
    """Tokenize every sample of one entry into ``builder``: drop those under ``min_sample_len`` tokens, truncate to
    ``sequence_len``, drop untrained ones."""
    name = entry.type or "pre-tokenized"
    stats = DatasetStats(where, name)
    tokenize = formats.get(entry.type, f"{where}.type") if entry.type else pretokenized
    if entry.type in ("chat_template", "sharegpt"):
        try:
            templates.resolve(templates.template_name(entry, config), config, tokenizer, "chat_template")
            templates.end_of_turn_ids(config, tokenizer)
        except ValueError as e:
            key = f"{where}.chat_template" if entry.chat_template else "chat_template"
            raise DataError(str(e).replace("chat_template:", f"{key}:", 1)) from None
    limit = config.sequence_len * getattr(tokenize, "sequences", 1)  # a format storing a pair sets sequences = 2
    for index, row in enumerate(iter_rows(entry, where)):
        stats.samples += 1
        problem = None
        try:
            out = tokenize(row.fields, tokenizer, entry, config)
        except KeyError as e:
            problem = f"{where}: sample {index} ({row.place}) has no field '{e.args[0]}', which type {name} needs"
        except (TypeError, ValueError) as e:
            problem = f"{where}: sample {index} ({row.place}) does not fit type {name}: {e}"
        if problem is not None:
            if strict:
                raise DataError(problem)
            stats.invalid += 1
            if len(stats.problems) < KEEP_PROBLEMS:
                stats.problems.append(problem)
            continue
        outs = out if isinstance(out, list) else [out]  # a format may make several samples of one row
        stats.samples += len(outs) - 1
        for out in outs:
            _add_sample(out, config, limit, builder, stats)
    return stats


def _add_sample(out: dict | None, config: Any, limit: int, builder: TableBuilder, stats: DatasetStats) -> None:
    """Add one tokenized sample to ``builder``, or count why it was dropped."""
    if out is None or not out["input_ids"]:
        stats.empty += 1
        return
    ids, labels = out["input_ids"], out["labels"]
    if config.min_sample_len and len(ids) < config.min_sample_len:
        stats.short += 1
        return
    if len(ids) > limit:
        stats.truncated += 1
        ids, labels = ids[:limit], labels[:limit]
    if not any(label != IGNORE for label in labels[1:]):
        stats.untrained += 1
        return
    if not builder.is_new(ids, labels):
        stats.duplicates += 1
        return
    builder.add(ids, labels)
    stats.kept += 1


def tokenize_entries(
    entries: list[Any], key: str, tokenizer: Any, formats: Registry, config: Any, strict: bool = True
) -> tuple[TokenTable, list[DatasetStats]]:
    """Tokenize ``entries`` (the list under ``key``) into one table; an entry left with no sample is an error."""
    builder = TableBuilder(deduplicate=config.dataset_exact_deduplication)
    stats = []
    for i, entry in enumerate(entries):
        one = tokenize_entry(entry, f"{key}[{i}]", tokenizer, formats, config, builder, strict)
        stats.append(one)
        if one.kept == 0 and (strict or not one.problems):
            message = f"{one.where}: no usable sample ({one.describe()})"
            if strict:
                raise DataError(message)
            one.problems.append(message)
    return builder.table(), stats


def split_eval(n: int, config: Any) -> tuple[np.ndarray, np.ndarray]:
    """(training, held-out) sample indices: ``val_set_size`` of the ``n`` samples, after the seeded shuffle."""
    order = list(range(n))
    if config.shuffle_merged_datasets:
        random.Random(config.seed).shuffle(order)
    size = config.val_set_size
    n_eval = int(size) if size >= 1 else round(size * n)
    if n_eval >= n:
        raise DataError(f"val_set_size: {size} leaves no training sample out of {n}")
    return np.array(order[n_eval:], dtype=np.int64), np.array(order[:n_eval], dtype=np.int64)
