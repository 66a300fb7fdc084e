"""The sequence split in one process: shards cover every token once, the causal work is balanced, labels
are shifted before the split, and the masks are the kernel's document masks restricted to each rank."""

from __future__ import annotations

import torch

from ktrain.data.batches import collate, document_mask
from ktrain.data.examples import Example
from ktrain_parallel.sequence import split_batch, zigzag


def test_zigzag_covers_every_token_once_with_equal_causal_work() -> None:
    length, ranks = 48, 4
    shards = [zigzag(length, ranks, r, torch.device("cpu")) for r in range(ranks)]
    assert sorted(torch.cat(shards).tolist()) == list(range(length))
    work = [int((shard + 1).sum()) for shard in shards]  # a query at index i attends to i + 1 keys
    assert len(set(work)) == 1, work


def packed_batch() -> dict[str, torch.Tensor]:
    rows = [
        [Example(input_ids=[5, 6, 7, 8, 9], labels=[-100, -100, 7, 8, 9]), Example(input_ids=[3, 4], labels=[3, 4])],
        [Example(input_ids=[1, 2, 3, 4, 5, 6, 7], labels=[1, 2, 3, 4, 5, 6, 7])],
    ]
    return collate(rows, pad_id=0, packed_attention="sdpa")


def test_split_shifts_labels_first_and_pads_to_the_multiple() -> None:
    batch = packed_batch()
    length = batch["input_ids"].shape[1]
    parts = [split_batch(batch, 2, r, 8, pad_id=0) for r in range(2)]
    padded = parts[0][1].documents.shape[1]
    assert padded == 8 and padded >= length
    shifted = torch.full((2, padded), -100)
    shifted[:, : length - 1] = batch["labels"][:, 1:]
    ids = torch.zeros((2, padded), dtype=torch.long)
    ids[:, :length] = batch["input_ids"]
    for part, split in parts:
        assert torch.equal(part["input_ids"], ids[:, split.local])
        assert torch.equal(part["shift_labels"], shifted[:, split.local])
    trained = sum(int((part["shift_labels"] != -100).sum()) for part, _ in parts)
    assert trained == int((batch["labels"][:, 1:] != -100).sum())  # no label lost or added by the split


def test_masks_are_the_kernels_document_masks_seen_from_each_rank() -> None:
    batch = packed_batch()
    _, split = split_batch(batch, 1, 0, 8, pad_id=0)
    length = split.documents.shape[1]
    expected = document_mask(split.documents, "sdpa")  # block-diagonal causal over the padded row
    assert torch.equal(split.mask(whole=True), expected)
    for rank in range(2):
        _, shard = split_batch(batch, 2, rank, 8, pad_id=0)
        assert torch.equal(shard.mask(whole=False), expected[:, :, shard.local, :])
        at = 0
        for i, (start, end) in enumerate(shard.runs):
            additive = shard.run_mask(i, torch.float32)
            allowed = expected[:, :, start:end, :end]
            assert torch.equal(additive == 0, allowed)
            at += end - start
        assert at == length // 2
