"""How a micro-batch of pairs becomes the tensors of one forward: the prompt once for both answers, or two rows.

The shared layout puts each pair in one row, ``prompt + chosen answer + rejected answer``: the rejected answer's
position ids restart after the prompt, and its tokens see the prompt and themselves, never the chosen answer
(causal attention within each of the segments prompt, chosen, rejected and padding, and every answer token also
sees the prompt; padding sees only padding). Both answers' first tokens are predicted from the prompt's last
position, so the scored tokens are named by (row, position, id) (``ktrain_preference.logps``). The prompt's
tokens then run once a pair instead of twice, in the policy's forward and backward and the reference's forward.

The mask is built in the form the model's attention takes: a 4-D boolean mask for SDPA, an additive one for
eager attention, a ``BlockMask`` for FlexAttention (``ktrain.data.batches.document_mask``). Where that cannot
be (FlashAttention's kernels take no mask, a model family not checked to honour a custom mask and position ids,
``pad_to_sequence_len``'s fixed shapes of ``sequence_len``), or where a pair's two sequences do not start with
the same prompt, the micro-batch keeps the two-row layout: the chosen sequences, then the rejected ones, each
prompt and answer, right-padded.

Either way the batch names every scored token: ``logps_at`` ``[3, tokens]`` (row, the position that predicts
it, its id) and ``logps_slots`` ``[2, tokens]`` (its group and its place in the group), and ``answer_tokens``
counts each group's tokens. Groups: the chosen answers, then the rejected ones (a pair's index, then the pairs
plus it), then, with ``whole_chosen`` (ORPO's NLL), each chosen sequence's prompt tokens after its first.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from ktrain.data.batches import document_mask, to_device
from ktrain.data.formats import IGNORE
from ktrain_preference.pairs import split

SHARED_ATTENTION = ("sdpa", "eager", "flex_attention")
"""Attention implementations that take the shared layout's mask."""
SHARED_MODELS = ("llama", "qwen2", "qwen3")
"""Model types whose attention is checked to take a custom 4-D mask and position ids as given (tests)."""
PADDING, PROMPT, CHOSEN, REJECTED = 0, 1, 2, 3
"""The segments of a shared row; the answers see ``PROMPT`` (``document_mask``'s prefix), padding does not."""

Sequences = list[tuple[list[int], list[int]]]


def shared_attention(model: Any) -> str | None:
    """The attention implementation to build shared rows' masks for, or None where ``model`` keeps two rows:
    an attention that takes no mask, a model type not checked, or a model with sliding-window layers."""
    config = model.config
    attention = getattr(config, "_attn_implementation", None) or "sdpa"
    text = config.get_text_config()
    windowed = any(kind != "full_attention" for kind in getattr(text, "layer_types", None) or ())
    if attention not in SHARED_ATTENTION or config.model_type not in SHARED_MODELS or windowed:
        return None
    return attention


def sequences(sample: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """A pair's sample as the ids and labels of its chosen sequence, then of its rejected one (int64 arrays:
    the host builds a micro-batch with array operations, not element by element, while the device trains)."""
    ids, labels = np.asarray(sample.input_ids, dtype=np.int64), np.asarray(sample.labels, dtype=np.int64)
    at = split(labels)
    return ids[:at], labels[:at], ids[at:], labels[at:]


def prompt_length(labels: np.ndarray) -> int:
    """The tokens before a sequence's first labelled one."""
    return int(np.argmax(labels != IGNORE))


class Scores:
    """The scored tokens of a micro-batch, gathered group by group in the order of their places."""

    def __init__(self, groups: int):
        self.parts: list[np.ndarray] = []
        self.counts = [0] * groups

    def sequence(
        self, ids: np.ndarray, labels: np.ndarray, row: int, places: np.ndarray, group: int, prompt: int | None
    ) -> None:
        """Score the labelled tokens of a sequence in ``row`` (``places``: each of its tokens' position in the row)
        in ``group``, and with ``prompt`` its other tokens after the first in that group."""
        targets, ids_after, before = labels[1:], ids[1:], places[:-1]
        scored = targets != IGNORE
        self._add(group, row, before[scored], targets[scored])
        if prompt is not None:
            self._add(prompt, row, before[~scored], ids_after[~scored])

    def _add(self, group: int, row: int, positions: np.ndarray, targets: np.ndarray) -> None:
        n, first = len(positions), self.counts[group]
        part = np.empty((5, n), dtype=np.int64)
        part[0], part[1], part[2], part[3], part[4] = row, positions, targets, group, np.arange(first, first + n)
        self.parts.append(part)
        self.counts[group] += n

    def tensors(self) -> dict[str, torch.Tensor]:
        scored = torch.from_numpy(np.concatenate(self.parts, axis=1) if self.parts else np.zeros((5, 0), np.int64))
        return {"logps_at": scored[:3], "logps_slots": scored[3:], "answer_tokens": torch.tensor(self.counts)}


def padded(sequences: Sequences, pad_id: int, pad_to: int | None) -> dict[str, torch.Tensor]:
    """``input_ids``, ``labels`` and ``attention_mask`` of (ids, labels) ``sequences``, right-padded to one length."""
    length = pad_to or max(len(ids) for ids, _ in sequences)
    batch = {
        "input_ids": torch.full((len(sequences), length), pad_id, dtype=torch.long),
        "labels": torch.full((len(sequences), length), IGNORE, dtype=torch.long),
        "attention_mask": torch.zeros((len(sequences), length), dtype=torch.long),
    }
    for i, (ids, labels) in enumerate(sequences):
        batch["input_ids"][i, : len(ids)] = torch.as_tensor(ids)
        batch["labels"][i, : len(ids)] = torch.as_tensor(labels)
        batch["attention_mask"][i, : len(ids)] = 1
    return batch


def two_rows(samples: list[Any], pad_id: int, pad_to: int | None, whole_chosen: bool) -> dict[str, Any]:
    """The chosen sequences of the pairs, then their rejected ones, right-padded: ``[2 x pairs, length]``."""
    pairs = [sequences(sample) for sample in samples]
    n = len(pairs)
    scores = Scores(3 * n if whole_chosen else 2 * n)
    for i, (chosen, chosen_labels, rejected, rejected_labels) in enumerate(pairs):
        scores.sequence(chosen, chosen_labels, i, np.arange(len(chosen)), i, 2 * n + i if whole_chosen else None)
        scores.sequence(rejected, rejected_labels, n + i, np.arange(len(rejected)), n + i, None)
    batch = padded([(c, cl) for c, cl, _, _ in pairs] + [(r, rl) for _, _, r, rl in pairs], pad_id, pad_to)
    del batch["labels"]
    return {**batch, **scores.tensors()}


def shared_rows(samples: list[Any], pad_id: int, attention: str, whole_chosen: bool, device: Any) -> dict | None:
    """One row a pair, ``prompt + chosen + rejected``, with its position ids and mask (built on ``device``);
    None when a pair's two sequences do not start with the same prompt."""
    pairs = [sequences(sample) for sample in samples]
    prompts = [prompt_length(chosen_labels) for _, chosen_labels, _, _ in pairs]
    for (chosen, _, rejected, rejected_labels), p in zip(pairs, prompts, strict=True):
        if prompt_length(rejected_labels) != p or not np.array_equal(chosen[:p], rejected[:p]):
            return None
    n = len(pairs)
    length = max(len(chosen) + len(rejected) - p for (chosen, _, rejected, _), p in zip(pairs, prompts, strict=True))
    ids = np.full((n, length), pad_id, dtype=np.int64)
    positions = np.zeros((n, length), dtype=np.int64)
    segments = np.full((n, length), PADDING, dtype=np.int64)
    scores = Scores(3 * n if whole_chosen else 2 * n)
    for i, ((chosen, chosen_labels, rejected, rejected_labels), p) in enumerate(zip(pairs, prompts, strict=True)):
        c, end = len(chosen), len(chosen) + len(rejected) - p
        ids[i, :c], ids[i, c:end] = chosen, rejected[p:]
        positions[i, :c] = np.arange(c)
        positions[i, c:end] = np.arange(p, len(rejected))
        positions[i, end:] = np.arange(length - end)
        segments[i, :p], segments[i, p:c], segments[i, c:end] = PROMPT, CHOSEN, REJECTED
        scores.sequence(chosen, chosen_labels, i, np.arange(c), i, 2 * n + i if whole_chosen else None)
        scores.sequence(rejected, rejected_labels, i, np.r_[0:p, c:end], n + i, None)
    mask = document_mask(to_device(torch.from_numpy(segments), torch.device(device or "cpu")), attention, prefix=PROMPT)
    tensors = {"input_ids": torch.from_numpy(ids), "position_ids": torch.from_numpy(positions)}
    return {**tensors, "attention_mask": mask, **scores.tensors()}
