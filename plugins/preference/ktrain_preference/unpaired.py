"""KTO's rows into samples: a prompt and one answer, labelled desirable or not, as TRL's KTOTrainer takes them.

A row holds ``prompt`` (text or turns), ``completion`` (text, a turn, or turns whose last is the answer) and
``label`` (true: desirable); a row that is a preference pair instead (``chosen`` and ``rejected``, no ``label``)
gives two samples, the chosen answer desirable and the rejected one not, as TRL's KTOTrainer unpairs it. The
answer's tokens are labelled with their ids when it is desirable and with ``UNDESIRABLE`` when it is not, the
prompt's with -100; the sequence is cut at ``sequence_len`` keeping its start, as TRL does. Rendering is that of
pairs (``ktrain_preference.pairs.render``).
"""

from __future__ import annotations

from typing import Any

from ktrain.data.formats import IGNORE
from ktrain_preference.pairs import answer_start, render

# The label of an undesirable answer's tokens (a token id is never negative; -100 is the prompt's).
UNDESIRABLE = -1


def desirable(row: dict) -> bool:
    """A KTO row's ``label``: true when its answer is desirable."""
    label = row.get("label")
    if label is None:
        raise KeyError("label")
    if not isinstance(label, bool):
        raise TypeError(f"label is a {type(label).__name__}, not true or false")
    return label


def unpaired_sample(prompt: list[int], with_answer: list[int], good: bool, limit: int) -> dict:
    """The sample of a prompt's token ids and the prompt with its answer, cut at ``limit``, the answer labelled
    with its ids (``good``) or with ``UNDESIRABLE``."""
    start = answer_start(prompt, (with_answer,), limit)
    ids = with_answer[:limit]
    answer = ids[start:] if good else [UNDESIRABLE] * (len(ids) - start)
    return {"input_ids": ids, "labels": [IGNORE] * start + answer}


def tokenize_unpaired(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict:
    """A KTO row as one sample ``prompt + completion``, the completion labelled by its desirability."""
    good = desirable(row)
    prompt, (with_answer,) = render(row, tokenizer, entry, config, ("completion",))
    return unpaired_sample(prompt, with_answer, good, config.sequence_len)


def is_pair(row: dict, entry: Any) -> bool:
    """Whether a KTO row is a preference pair (no ``label``, a chosen answer): TRL's KTOTrainer unpairs those."""
    return "label" not in row and (entry.field_chosen or "chosen") in row


def tokenize_unpaired_pair(row: dict, tokenizer: Any, entry: Any, config: Any) -> list[dict]:
    """A preference pair as two KTO samples, as TRL's ``unpair_preference_dataset`` makes two rows of it: the prompt
    with the chosen answer (desirable), and the prompt with the rejected one (undesirable)."""
    fields = (entry.field_chosen or "chosen", entry.field_rejected or "rejected")
    prompt, (with_chosen, with_rejected) = render(row, tokenizer, entry, config, fields)
    limit = config.sequence_len
    return [unpaired_sample(prompt, with_chosen, True, limit), unpaired_sample(prompt, with_rejected, False, limit)]


def answer_of(labels: Any) -> tuple[int, bool]:
    """(where the answer starts, whether it is desirable) in a sample's labels."""
    start = next(i for i, label in enumerate(labels) if label != IGNORE)
    return start, bool(labels[start] != UNDESIRABLE)
