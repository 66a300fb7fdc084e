"""Which rows each rank trains on at each step, decided by arithmetic alone, and how rows become tensors.

The order of an epoch depends only on the seed and the epoch number, so a resumed run needs nothing but
its step to be at the same place: no sampler state, no DataLoader generator to restore. The rows of one
optimizer step are the same whatever the split into ranks and micro-batches, so losses compare
across layouts.
"""

from __future__ import annotations

import functools
import random

import attrs
import torch

from ktrain.data.examples import Example
from ktrain.data.formats import IGNORE


@attrs.frozen
class BatchPlan:
    """Rows of ``n`` examples cut into global batches of ``micro × accum × dp_size`` rows per step."""

    n: int
    micro: int
    accum: int
    dp_size: int
    seed: int

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
        return order

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


def collate(examples: list[Example], pad_id: int, pad_to: int | None = None) -> dict[str, torch.Tensor]:
    """Right-pad a micro-batch to its longest row (or ``pad_to``); padding carries no label."""
    length = pad_to or max(len(e.input_ids) for e in examples)
    ids = torch.full((len(examples), length), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), length), IGNORE, dtype=torch.long)
    mask = torch.zeros((len(examples), length), dtype=torch.long)
    for i, e in enumerate(examples):
        n = len(e.input_ids)
        ids[i, :n] = torch.tensor(e.input_ids)
        labels[i, :n] = torch.tensor(e.labels)
        mask[i, :n] = 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}
