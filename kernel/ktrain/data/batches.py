"""Which rows each rank trains on at each step, decided by arithmetic alone, and how rows become tensors.

The order of an epoch depends only on the seed and the epoch number, so a resumed run needs nothing but
its step to be at the same place: no sampler state, no DataLoader generator to restore. The rows of one
optimizer step are the same whatever the split into ranks and micro-batches, so losses compare
across layouts. With ``group_by_length`` the shuffled order is grouped as Hugging Face's
``LengthGroupedSampler`` groups it, with one optimizer step's rows as its batch: cut into mega-batches of
up to 50 steps, each sorted longest first, the longest row of all in the first step; a micro-batch then
holds rows of similar length and pads less.
"""

from __future__ import annotations

import functools
import random
from typing import Any

import attrs
import torch

from ktrain.data.examples import Example, TokenTable
from ktrain.data.formats import IGNORE

MEGA_BATCH_STEPS = 50
"""Steps of a mega-batch sorted by length (``group_by_length``), at most; fewer when the epoch has under 200."""


def to_device(value: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``value`` copied to ``device``; on CUDA from pinned memory, so the host queues the copy and goes on.

    A copy from ordinary (pageable) memory first waits for all work already queued on the device, which
    would stop the host from queuing the next step while the device finishes this one.
    """
    if device.type == "cuda" and value.device.type == "cpu":
        value = value.pin_memory()
    return value.to(device, non_blocking=True)


@attrs.frozen(cache_hash=True)
class BatchPlan:
    """Rows of ``n`` examples cut into global batches of ``micro × accum × dp_size`` rows per step; with
    ``lengths`` (each row's tokens) the order of an epoch is grouped by length."""

    n: int
    micro: int
    accum: int
    dp_size: int
    seed: int
    lengths: tuple[int, ...] = ()

    @property
    def rows_per_step(self) -> int:
        return self.micro * self.accum * self.dp_size

    @property
    def steps_per_epoch(self) -> int:
        return self.n // self.rows_per_step

    @functools.lru_cache(maxsize=2)  # noqa: B019 - a few epochs' orders on a frozen object
    def order(self, epoch: int) -> list[int]:
        order = list(range(self.n))
        random.Random(f"ktrain:{self.seed}:{epoch}").shuffle(order)
        return self._grouped(order) if self.lengths else order

    def _grouped(self, order: list[int]) -> list[int]:
        """``order`` cut into mega-batches sorted longest first, the longest row moved to the front."""
        size = max(min(self.n // (self.rows_per_step * 4), MEGA_BATCH_STEPS), 1) * self.rows_per_step
        megas = [sorted(order[i : i + size], key=lambda r: -self.lengths[r]) for i in range(0, self.n, size)]
        longest = max(range(len(megas)), key=lambda m: self.lengths[megas[m][0]])
        megas[0][0], megas[longest][0] = megas[longest][0], megas[0][0]
        return [r for mega in megas for r in mega]

    def step_rows(self, step: int) -> list[list[list[int]]]:
        """Row indices of global ``step`` (counted from 0 over all epochs): ``[rank][micro] -> rows``."""
        epoch, index = divmod(step, self.steps_per_epoch)
        start = index * self.rows_per_step
        rows = self.order(epoch)[start : start + self.rows_per_step]
        return [
            [
                rows[(k * self.dp_size + r) * self.micro : (k * self.dp_size + r + 1) * self.micro]
                for k in range(self.accum)
            ]
            for r in range(self.dp_size)
        ]


class PlannedRows:
    """The rows of a map-style dataset (each a list of samples: one, or several when packed) cut by a plan."""

    def __init__(self, table: TokenTable, rows: list[list[int]], plan: BatchPlan):
        self.table, self.rows, self.plan = table, rows, plan
        self.steps_per_epoch, self.dp_size, self.n = plan.steps_per_epoch, plan.dp_size, plan.n
        self.rows_per_step = plan.rows_per_step

    def row(self, i: int) -> list[Example]:
        return [self.table[j] for j in self.rows[i]]

    def step(self, step: int) -> list[list[list[list[Example]]]]:
        """The rows of global ``step``: ``[rank][micro] -> rows``, each row a list of samples."""
        return [[[self.row(i) for i in micro] for micro in rank] for rank in self.plan.step_rows(step)]


def row_tokens(row: list[Example]) -> int:
    return sum(len(e.input_ids) for e in row)


def row_trained(row: list[Example]) -> int:
    """Trained tokens of a row: the samples' own, since each sample's first token is never a target."""
    return sum(e.trained_tokens for e in row)


def collate(
    rows: list[list[Example]],
    pad_id: int,
    pad_to: int | None = None,
    packed_attention: str | None = None,
    mask_device: torch.device | None = None,
) -> dict[str, Any]:
    """Right-pad a micro-batch of rows to the longest (or ``pad_to``); padding carries no label.

    Without ``packed_attention`` every row holds one sample and the batch has a 2-D ``attention_mask``.
    With it (the model's attention implementation), a row holds several samples: position ids restart
    at 0 for each, each sample's first token has no label (it is not predicted from the sample before),
    and attention stays within a sample: ``flash_attention_*`` finds the samples from the position ids
    alone (variable-length kernels); ``flex_attention`` gets a document ``BlockMask``; SDPA (and any
    other) a block-diagonal causal 4-D mask, boolean, or additive for ``eager``. The mask is built on
    ``mask_device`` (the CPU when None): built on the GPU it costs no host time and no copy.
    """
    length = pad_to or max(row_tokens(row) for row in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), length), IGNORE, dtype=torch.long)
    if packed_attention is None:
        mask = torch.zeros((len(rows), length), dtype=torch.long)
        for i, (e,) in enumerate(rows):
            n = len(e.input_ids)
            ids[i, :n] = torch.tensor(e.input_ids)
            labels[i, :n] = torch.tensor(e.labels)
            mask[i, :n] = 1
        return {"input_ids": ids, "labels": labels, "attention_mask": mask}
    positions = torch.zeros((len(rows), length), dtype=torch.long)
    documents = torch.zeros((len(rows), length), dtype=torch.long)
    for i, row in enumerate(rows):
        at = 0
        for d, e in enumerate(row):
            n = len(e.input_ids)
            ids[i, at : at + n] = torch.tensor(e.input_ids)
            labels[i, at + 1 : at + n] = torch.tensor(e.labels[1:])
            positions[i, at : at + n] = torch.arange(n)
            documents[i, at : at + n] = d
            at += n
        positions[i, at:] = torch.arange(length - at)  # padding: one more document of its own
        documents[i, at:] = len(row)
    batch: dict[str, Any] = {"input_ids": ids, "labels": labels, "position_ids": positions}
    if "flash" not in packed_attention:
        batch["attention_mask"] = document_mask(
            to_device(documents, torch.device(mask_device or "cpu")), packed_attention
        )
    return batch


def document_mask(documents: torch.Tensor, attention: str, prefix: int | None = None) -> Any:
    """Causal attention within each document of ``documents`` ``[batch, length]``, in the form ``attention`` takes.

    With ``prefix``, the documents numbered above ``prefix`` also see document ``prefix`` (a prompt shared by the
    documents after it); those numbered below it do not.
    """
    length = documents.shape[1]
    causal = torch.ones((length, length), dtype=torch.bool, device=documents.device).tril()
    seen = documents[:, :, None] == documents[:, None, :]
    if prefix is not None:
        seen = seen | ((documents[:, None, :] == prefix) & (documents[:, :, None] > prefix))
    allowed = seen & causal
    if attention == "flex_attention":

        def same_document(b: Any, h: Any, q: Any, k: Any) -> Any:
            seen = documents[b, q] == documents[b, k]
            if prefix is not None:
                seen = seen | ((documents[b, k] == prefix) & (documents[b, q] > prefix))
            return seen & (q >= k)

        return _block_mask(allowed, same_document)
    if attention == "eager":
        additive = torch.zeros(allowed.shape, dtype=torch.float32, device=documents.device)
        return additive.masked_fill(~allowed, torch.finfo(torch.float32).min)[:, None]
    return allowed[:, None]


BLOCK = 128
"""The side of FlexAttention's tiles of (query, key) positions (its default block size)."""


def _block_mask(allowed: torch.Tensor, mask_mod: Any) -> Any:
    """FlexAttention's ``BlockMask`` of the boolean mask ``allowed`` ``[batch, length, length]``, whose every
    (query, key) ``mask_mod`` gives: each tile of ``BLOCK`` x ``BLOCK`` positions is skipped (nothing allowed),
    full (all allowed: no mask evaluated in it) or partial (``mask_mod`` evaluated in the kernel). The tiles come
    from ``allowed`` by a few tensor operations; ``create_block_mask`` finds the same ones by evaluating
    ``mask_mod`` through vmap, many small operations that the host launches one by one each step. The backward's
    (query-side) tiles come from the transposed tiles the same way; ``BlockMask.from_kv_blocks`` would derive them
    from the key-side lists through a dense round trip, five times the host's time."""
    from torch.nn.attention.flex_attention import BlockMask

    batch, length = allowed.shape[0], allowed.shape[-1]
    tiles, pad = -(-length // BLOCK), -length % BLOCK
    padded = torch.nn.functional.pad(allowed, (0, pad, 0, pad))
    counts = padded.view(batch, 1, tiles, BLOCK, tiles, BLOCK).sum((3, 5))
    full = counts == BLOCK * BLOCK
    partial = (counts > 0) & ~full

    def ordered(kept: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """How many tiles of each row of tiles are kept, and their columns first (then the others, in order);
        contiguous, as FlexAttention's FLASH backend (FlashAttention-4's kernels) takes them."""
        ones = kept.to(torch.int32, memory_format=torch.contiguous_format)
        columns = torch.argsort(ones, dim=-1, descending=True, stable=True)
        return ones.sum(-1, dtype=torch.int32), columns.to(torch.int32)

    (kv_partial, kv_partial_at), (kv_full, kv_full_at) = ordered(partial), ordered(full)
    (q_partial, q_partial_at), (q_full, q_full_at) = ordered(partial.mT), ordered(full.mT)  # the key tiles' view
    return BlockMask(
        seq_lengths=(length, length),
        kv_num_blocks=kv_partial,
        kv_indices=kv_partial_at,
        full_kv_num_blocks=kv_full,
        full_kv_indices=kv_full_at,
        q_num_blocks=q_partial,
        q_indices=q_partial_at,
        full_q_num_blocks=q_full,
        full_q_indices=q_full_at,
        BLOCK_SIZE=(BLOCK, BLOCK),
        mask_mod=mask_mod,
    )
