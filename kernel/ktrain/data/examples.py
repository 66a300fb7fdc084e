"""Tokenizing every dataset into examples and splitting off the evaluation set, the same on every rank."""

from __future__ import annotations

import random
from typing import Any

import attrs

from ktrain.data.formats import IGNORE, pretokenized
from ktrain.data.reading import DataError, read_rows
from ktrain.registry import Registry


@attrs.define
class Example:
    """One tokenized sample; ``labels`` is -100 where no loss is taken."""

    input_ids: list[int]
    labels: list[int]

    @property
    def trained_tokens(self) -> int:
        """Label tokens that count in the loss after the model's shift by one."""
        return sum(1 for label in self.labels[1:] if label != IGNORE)


@attrs.define
class Examples:
    """The training and evaluation examples of a run, with what was dropped or cut."""

    train: list[Example]
    eval: list[Example]
    skipped: int
    truncated: int


def tokenize_all(config: Any, tokenizer: Any, formats: Registry) -> Examples:
    """Read and tokenize every ``datasets:`` entry, truncate to ``sequence_len``, split ``val_set_size``."""
    examples: list[Example] = []
    skipped = truncated = 0
    for i, entry in enumerate(config.datasets):
        where = f"datasets[{i}]"
        tokenize = formats.get(entry.type, f"{where}.type") if entry.type else pretokenized
        for row in read_rows(entry, where):
            try:
                out = tokenize(row, tokenizer, entry, config)
            except (KeyError, TypeError, ValueError) as e:
                raise DataError(f"{where}: a row does not fit type {entry.type}: {type(e).__name__}: {e}") from None
            if out is None or not any(label != IGNORE for label in out["labels"][1:]):
                skipped += 1
                continue
            ids, labels = out["input_ids"], out["labels"]
            if len(ids) > config.sequence_len:
                truncated += 1
                ids, labels = ids[: config.sequence_len], labels[: config.sequence_len]
                if not any(label != IGNORE for label in labels[1:]):
                    skipped += 1
                    continue
            examples.append(Example(ids, labels))
    if not examples:
        raise DataError("datasets: no usable rows (every row was empty, unreadable or had nothing to train on)")
    order = list(range(len(examples)))
    if config.shuffle_merged_datasets:
        random.Random(config.seed).shuffle(order)
    size = config.val_set_size
    n_eval = int(size) if size >= 1 else round(size * len(examples))
    if n_eval >= len(examples):
        raise DataError(f"val_set_size: {size} leaves no training rows out of {len(examples)}")
    eval_set = [examples[j] for j in order[:n_eval]]
    train_set = [examples[j] for j in order[n_eval:]]
    return Examples(train_set, eval_set, skipped, truncated)
