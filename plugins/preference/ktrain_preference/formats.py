"""The dataset type of preference rows, ``chat_template.default``: pairs, or under ``rl: kto`` single answers.

A pair's sample holds two sequences end to end (``ktrain_preference.pairs``), so the kernel cuts samples of
this type at twice ``sequence_len``; each sequence is cut at ``sequence_len`` by its tokenizer.
"""

from __future__ import annotations

from typing import Any

from ktrain_preference.pairs import tokenize_pair
from ktrain_preference.unpaired import is_pair, tokenize_unpaired, tokenize_unpaired_pair


def tokenize_preference(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | list[dict]:
    """A row as a sample: an unpaired answer under ``rl: kto`` (a pair there: two, TRL's unpairing), else a pair."""
    if config.rl == "kto":
        if is_pair(row, entry):
            return tokenize_unpaired_pair(row, tokenizer, entry, config)
        return tokenize_unpaired(row, tokenizer, entry, config)
    return tokenize_pair(row, tokenizer, entry, config)


tokenize_preference.sequences = 2  # type: ignore[attr-defined]
