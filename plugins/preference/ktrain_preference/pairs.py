"""Preference rows into samples: the prompt with the chosen answer, then the prompt with the rejected one.

One sample holds both sequences end to end, ``prompt + chosen + prompt + rejected``; the answers carry
labels, the prompts -100, so the chosen answer is the first run of labels and the rejected sequence
starts at the first -100 after it (``split``). The kernel cuts such a sample at twice ``sequence_len``
(``ktrain_preference.formats``); each sequence is cut at ``sequence_len`` here, keeping its start, as
TRL's DPOTrainer does.

Rows are Axolotl's ``chat_template.default`` (the prompt's turns in ``field_messages``, the answers in
``field_chosen`` and ``field_rejected``: text, a turn, or a list of turns whose last is the answer) or
TRL's ``prompt``/``chosen``/``rejected``. Turns are rendered with the chat template: the prompt with the
generation prompt, then prompt and answer as one conversation; the answer is what follows their common
prefix. All-text rows with a ``prompt`` field are plain text: the answer gets the EOS token and the
tokenizer its special tokens, as in TRL.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ktrain.data import templates
from ktrain.data.formats import IGNORE


def _turn(value: Any, mapping: dict[str, str], role: str) -> dict[str, str]:
    """One ``{"role", "content"}`` turn: text becomes a turn of ``role``."""
    if isinstance(value, str):
        return {"role": role, "content": value}
    if not isinstance(value, dict):
        raise TypeError(f"a turn is a {type(value).__name__}, not text or an object")
    role_key, content_key = mapping.get("role", "role"), mapping.get("content", "content")
    if role_key not in value or content_key not in value:
        raise KeyError(f"{role_key}/{content_key}")
    return {"role": value[role_key], "content": value[content_key]}


def _answer(value: Any, mapping: dict[str, str]) -> dict[str, str]:
    """The answer turn: text, a turn, or the last of a list of turns."""
    if isinstance(value, list):
        if not value:
            raise ValueError("an answer is an empty list of turns")
        value = value[-1]
    return _turn(value, mapping, "assistant")


def _prefix(a: Sequence[int], b: Sequence[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def render_text(prompt: str, answers: Sequence[str], tokenizer: Any) -> tuple[list[int], list[list[int]]]:
    """Plain text as TRL tokenizes it: the prompt, and the prompt with each answer ended by the EOS token."""
    eos = tokenizer.eos_token or ""
    texts = [v if v.endswith(eos) else v + eos for v in answers]
    return tokenizer(prompt)["input_ids"], [tokenizer(prompt + text)["input_ids"] for text in texts]


def render(
    row: dict, tokenizer: Any, entry: Any, config: Any, answers: Sequence[str]
) -> tuple[list[int], list[list[int]]]:
    """Token ids of the prompt, and of the prompt with each answer (the row's fields named by ``answers``)."""
    field = entry.field_messages or ("prompt" if "prompt" in row else "messages")
    for name in (field, *answers):
        if row.get(name) is None:
            raise KeyError(name)
    prompt, texts = row[field], [row[name] for name in answers]
    if field == "prompt" and all(isinstance(v, str) for v in (prompt, *texts)):
        return render_text(prompt, texts, tokenizer)
    mapping = entry.message_property_mappings or {}
    turns = [_turn(prompt, mapping, "user")] if isinstance(prompt, str) else [_turn(t, mapping, "user") for t in prompt]
    template = templates.resolve(templates.template_name(entry, config), config, tokenizer, "chat_template")

    def ids(messages: list[dict], generation_prompt: bool) -> list[int]:
        out = tokenizer.apply_chat_template(
            messages, tokenize=True, add_generation_prompt=generation_prompt, chat_template=template, return_dict=True
        )
        return list(out["input_ids"])

    return ids(turns, True), [ids([*turns, _answer(text, mapping)], False) for text in texts]


def answer_start(prompt: Sequence[int], answers: Sequence[Sequence[int]], limit: int) -> int:
    """Where the answers start: the prompt's ids common to all of them; a ValueError when none is left to train."""
    start = min(_prefix(prompt, ids) for ids in answers)
    if start == 0:
        raise ValueError("the prompt is empty")
    if start >= limit:
        raise ValueError(f"the prompt's {start} tokens fill sequence_len {limit}: no answer token is left")
    if any(len(ids) == start for ids in answers):
        raise ValueError("an answer is empty")
    return start


def tokenize_pair(row: dict, tokenizer: Any, entry: Any, config: Any) -> dict | None:
    """A preference row as one sample ``prompt + chosen + prompt + rejected``, the answers labelled."""
    chosen_field, rejected_field = entry.field_chosen or "chosen", entry.field_rejected or "rejected"
    prompt, (with_chosen, with_rejected) = render(row, tokenizer, entry, config, (chosen_field, rejected_field))
    return pair_sample(prompt, with_chosen, with_rejected, config.sequence_len)


def pair_sample(prompt: list[int], with_chosen: list[int], with_rejected: list[int], limit: int) -> dict:
    """The sample ``prompt + chosen + prompt + rejected`` of a pair's token ids, each sequence cut at ``limit``."""
    start = answer_start(prompt, (with_chosen, with_rejected), limit)
    chosen, rejected = with_chosen[:limit], with_rejected[:limit]
    labels = [IGNORE] * start + chosen[start:] + [IGNORE] * start + rejected[start:]
    return {"input_ids": chosen + rejected, "labels": labels}


def split(labels: np.ndarray) -> int:
    """Where the rejected sequence starts in a pair's sample: the first -100 after the first labelled token."""
    ignored = labels == IGNORE
    at = int(np.argmax(~ignored))
    return at + int(np.argmax(ignored[at:]))


def sample_key(ids: Sequence[int], labels: Sequence[int]) -> bytes:
    """A digest of a sample's tokens and labels (what its precomputed reference log-probabilities are found by)."""
    data = np.asarray(ids, dtype=np.int32).tobytes() + b"|" + np.asarray(labels, dtype=np.int32).tobytes()
    return hashlib.blake2b(data, digest_size=16).digest()
