"""The preference objective: pairs collated chosen-then-rejected into one forward, and the DPO/IPO loss.

Each pair's loss is TRL's DPOTrainer's for the same ``loss_type`` (``sigmoid`` for DPO, with conservative
DPO's label smoothing; ``ipo``), computed from the summed log-probabilities of each answer's tokens
under the policy and under the reference. A pair is one item: the loss of a step is the mean over the
pairs of the global batch. The rewards and log-probabilities TRL logs are summed here over the pairs
trained since the last logged step, and read (summed over the ranks) by ``metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ktrain.data.formats import IGNORE
from ktrain.run import distributed
from ktrain_preference.keys import METHODS
from ktrain_preference.pairs import split

METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def answer_logps(logits: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each row's labelled tokens, their count), the model's shift by one applied."""
    targets = labels[:, 1:]
    mask = targets != IGNORE
    logps = torch.log_softmax(logits[:, :-1].float(), dim=-1)
    picked = logps.gather(-1, targets.clamp(min=0).unsqueeze(-1)).squeeze(-1)
    return (picked * mask).sum(-1), mask.sum(-1)


class PairObjective:
    """Owner of the run's objective under ``rl: dpo`` or ``rl: ipo``.

    ``reference(batch)`` returns the reference model's logits for a batch (the base with the adapter
    switched off, or a frozen copy of the model as loaded).
    """

    def __init__(self, config: Any, reference: Callable[[dict[str, torch.Tensor]], torch.Tensor], device: Any):
        self.loss_type = METHODS[config.rl]
        self.beta = config.rl_beta if config.rl_beta is not None else 0.1
        self.smoothing = config.dpo_label_smoothing
        self.reference = reference
        self.device = device
        self.sums = torch.zeros(len(METRICS) + 1, dtype=torch.float64, device=device)  # the metrics, then pairs

    def items(self, row: list[Any]) -> int:
        """A pair is one item."""
        return 1

    def collate(
        self, rows: list[list[Any]], pad_id: int, pad_to: int | None, packed_attention: str | None, device: Any
    ) -> dict[str, Any]:
        """The chosen sequences of the rows, then their rejected ones, right-padded: ``[2 x rows, length]``."""
        chosen, rejected = [], []
        for (sample,) in rows:
            ids, labels = list(sample.input_ids), list(sample.labels)
            at = split(labels)
            chosen.append((ids[:at], labels[:at]))
            rejected.append((ids[at:], labels[at:]))
        sequences = chosen + rejected
        length = pad_to or max(len(ids) for ids, _ in sequences)
        batch = {
            "input_ids": torch.full((len(sequences), length), pad_id, dtype=torch.long),
            "labels": torch.full((len(sequences), length), IGNORE, dtype=torch.long),
            "attention_mask": torch.zeros((len(sequences), length), dtype=torch.long),
        }
        for i, (ids, labels) in enumerate(sequences):
            batch["input_ids"][i, : len(ids)] = torch.tensor(ids)
            batch["labels"][i, : len(ids)] = torch.tensor(labels)
            batch["attention_mask"][i, : len(ids)] = 1
        return batch

    def loss(self, model: Any, batch: dict[str, Any], num_items: float) -> torch.Tensor:
        """The pairs' summed loss over ``num_items``; one forward of the policy, one of the reference."""
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "use_cache": False}
        logps, counts = answer_logps(model(**inputs).logits, batch["labels"])
        with torch.no_grad():
            ref_logps, _ = answer_logps(self.reference(inputs), batch["labels"])
        chosen, rejected = logps.chunk(2)
        chosen_ratio, rejected_ratio = chosen - ref_logps.chunk(2)[0], rejected - ref_logps.chunk(2)[1]
        if self.loss_type == "ipo":  # TRL's IPO: log-ratios averaged over each answer's tokens
            chosen_count, rejected_count = counts.chunk(2)
            delta = chosen_ratio / chosen_count.clamp(min=1) - rejected_ratio / rejected_count.clamp(min=1)
            losses = (delta - 1 / (2 * self.beta)) ** 2
        else:
            delta = chosen_ratio - rejected_ratio
            losses = -F.logsigmoid(self.beta * delta) * (1 - self.smoothing)
            if self.smoothing:
                losses = losses - F.logsigmoid(-self.beta * delta) * self.smoothing
        if torch.is_grad_enabled():  # training, not evaluation: the metrics of the logged window
            self._record(chosen.detach(), rejected.detach(), chosen_ratio.detach(), rejected_ratio.detach())
        return losses.sum() / num_items

    def _record(self, chosen: Any, rejected: Any, chosen_ratio: Any, rejected_ratio: Any) -> None:
        good, bad = self.beta * chosen_ratio, self.beta * rejected_ratio
        values = [good, bad, good - bad, (good > bad).float(), chosen, rejected]
        pairs = torch.tensor([float(len(chosen))], dtype=torch.float64, device=chosen.device)
        self.sums += torch.cat([torch.stack([v.sum().double() for v in values]), pairs])

    def metrics(self) -> dict[str, float]:
        """TRL's rewards/* and logps/* over the pairs trained since the last call, on every rank."""
        totals = distributed.all_reduce_sum([float(v) for v in self.sums], self.device)
        self.sums.zero_()
        pairs = max(totals[-1], 1.0)
        return {name: value / pairs for name, value in zip(METRICS, totals[:-1], strict=True)}


def adapter_off(model: Any) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The reference of an adapter run: ``model`` (a peft model) with its adapter switched off."""

    def reference(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        with model.disable_adapter():
            return model(**inputs).logits

    return reference


def frozen(copy: Any) -> Callable[[dict[str, torch.Tensor]], torch.Tensor]:
    """The reference of full fine-tuning: a frozen copy of the model as loaded."""
    copy.eval()
    copy.requires_grad_(False)

    def reference(inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return copy(**inputs).logits

    return reference
