"""Splitting a micro-batch's sequence over ranks, and the attention masks of the split.

The labels are shifted before the split (``shift_labels``: token t is trained to predict token t+1),
so no prediction crosses a shard boundary. Rows are padded (no label) to a multiple of the split. With
``ranks`` > 1 the sequence is cut into ``2 x ranks`` chunks and rank r keeps chunks r and 2·ranks-1-r
(zigzag): under a causal mask every rank then has the same attention work. Documents (samples of a
packed row) are found where the position ids restart at 0; attention never crosses them.
"""

from __future__ import annotations

from typing import Any

import attrs
import torch
import torch.nn.functional as F

IGNORE = -100


@attrs.define
class Split:
    """One rank's view of the split sequence of a micro-batch.

    ``local`` are the global indices of this rank's tokens, made of the contiguous ``runs``
    ``(start, end)``; ``order`` the global index of each token of the sequence gathered in rank order
    (``natural`` undoes that order); ``documents`` ``[batch, length]`` the document of each token.
    """

    local: torch.Tensor
    order: torch.Tensor
    documents: torch.Tensor
    packed: bool
    runs: list[tuple[int, int]]
    natural: torch.Tensor = attrs.field(init=False)
    _masks: dict[str, torch.Tensor | None] = attrs.field(init=False, factory=dict)

    def __attrs_post_init__(self) -> None:
        self.natural = torch.argsort(self.order)

    def run_mask(self, run: int, dtype: torch.dtype) -> torch.Tensor:
        """Additive ``[batch or 1, 1, run length, run end]`` mask of this rank's run ``run`` over the keys
        before its end: causal (and within documents for packed rows). Made once per micro-batch and
        shared by every layer, so that autograd keeps one copy."""
        name = f"run{run}-{dtype}"
        if name not in self._masks:
            start, end = self.runs[run]
            at = sum(b - a for a, b in self.runs[:run])
            allowed = self.mask(whole=False)[:, :, at : at + end - start, :end]
            blocked = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
            self._masks[name] = blocked.masked_fill_(~allowed, torch.finfo(dtype).min)
        return self._masks[name]

    def mask(self, whole: bool) -> torch.Tensor | None:
        """Boolean ``[batch, 1, queries, length]`` mask over all keys in natural order, for this rank's
        queries or (``whole``) every query; None where SDPA's own causal mask is the same."""
        name = "whole" if whole else "local"
        if name not in self._masks:
            length = self.documents.shape[1]
            queries = torch.arange(length, device=self.local.device) if whole else self.local
            if whole and not self.packed:
                self._masks[name] = None
            else:
                keys = torch.arange(length, device=queries.device)
                allowed = (keys[None, :] <= queries[:, None])[None, None]
                if self.packed:
                    docs = self.documents
                    allowed = allowed & (docs[:, None, None, :] == docs[:, queries][:, None, :, None])
                self._masks[name] = allowed
        return self._masks[name]


def zigzag_runs(length: int, ranks: int, rank: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` runs held by ``rank``: chunks ``rank`` and ``2·ranks-1-rank`` of ``2·ranks``."""
    chunk = length // (2 * ranks)
    return [(rank * chunk, (rank + 1) * chunk), ((2 * ranks - 1 - rank) * chunk, (2 * ranks - rank) * chunk)]


def zigzag(length: int, ranks: int, rank: int, device: torch.device) -> torch.Tensor:
    """Global indices held by ``rank``, in order."""
    return torch.cat([torch.arange(a, b, device=device) for a, b in zigzag_runs(length, ranks, rank)])


def split_batch(
    batch: dict[str, Any], ranks: int, rank: int, multiple: int, pad_id: int
) -> tuple[dict[str, Any], Split]:
    """This rank's part of ``batch`` (``input_ids``, ``labels``, optional ``position_ids``), padded to
    a multiple of ``multiple`` (itself a multiple of ``2 x ranks`` when ``ranks`` > 1)."""
    ids, labels = batch["input_ids"], batch["labels"]
    positions = batch.get("position_ids")
    packed = positions is not None
    rows, length = ids.shape
    shifted = F.pad(labels[:, 1:], (0, 1), value=IGNORE)
    extra = -length % multiple
    if positions is None:
        positions = torch.arange(length + extra, device=ids.device).expand(rows, -1)
    elif extra:
        positions = torch.cat([positions, torch.arange(extra, device=ids.device).expand(rows, -1)], dim=1)
    if extra:
        ids = F.pad(ids, (0, extra), value=pad_id)
        shifted = F.pad(shifted, (0, extra), value=IGNORE)
    length += extra
    documents = torch.cumsum(positions == 0, dim=1)
    if ranks > 1:
        runs = zigzag_runs(length, ranks, rank)
        local = zigzag(length, ranks, rank, ids.device)
        order = torch.cat([zigzag(length, ranks, r, ids.device) for r in range(ranks)])
    else:
        runs = [(0, length)]
        local = order = torch.arange(length, device=ids.device)
    part = {
        "input_ids": ids[:, local],
        "labels": shifted[:, local],
        "shift_labels": shifted[:, local],
        "position_ids": positions[:, local].contiguous(),
    }
    return part, Split(local=local, order=order, documents=documents, packed=packed, runs=runs)
