"""The default owner of ``objective``: the causal-LM loss over the trained tokens (labels other than -100)."""

from __future__ import annotations

from typing import Any

import torch

from ktrain import hookimpl
from ktrain.data.batches import collate, row_trained, to_device
from ktrain.data.examples import Example


class CausalLM:
    """Next-token cross-entropy summed over the trained tokens, divided by those of the global batch."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_build_objective(self, run: Any, engine: Any) -> CausalLM:
        return self

    def items(self, row: list[Example]) -> int:
        """The row's trained tokens."""
        return row_trained(row)

    def collate(
        self, rows: list[list[Example]], pad_id: int, pad_to: int | None, packed_attention: str | None, device: Any
    ) -> dict[str, Any]:
        """``ktrain.data.batches.collate``."""
        return collate(rows, pad_id, pad_to, packed_attention, device)

    def loss(self, model: Any, batch: dict[str, Any], num_items: float) -> torch.Tensor:
        """The model's own loss, told the divisor (``num_items_in_batch``)."""
        device = batch["input_ids"].device
        return model(**batch, num_items_in_batch=to_device(torch.tensor(num_items), device)).loss
