"""The preference objective: pairs collated chosen-then-rejected into one forward, and their loss.

DPO and IPO are TRL's DPOTrainer's ``sigmoid`` (with conservative DPO's label smoothing) and ``ipo``
losses, from the summed log-probabilities of each answer's tokens under the policy and the reference
(computed without the full logits where the model allows: ``ktrain_preference.logps``);
ORPO is TRL's ORPOTrainer's and SimPO its CPOTrainer's ``simpo``, from the mean log-probabilities, with
the chosen sequences' NLL. A pair is one item: the loss of a step is the mean over the pairs of the
global batch (the NLL term of ORPO and SimPO is a token mean within each micro-batch, as in TRL, weighted
by its pairs). The rewards and log-probabilities TRL logs are summed here over the pairs
trained since the last logged step, and read (summed over the ranks) by ``metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ktrain.data.formats import IGNORE
from ktrain.run import distributed
from ktrain_preference.keys import DEFAULT_BETA, METHODS
from ktrain_preference.logps import token_logps
from ktrain_preference.pairs import sample_key, split

# (inputs, targets) -> the per-token log-probabilities of targets under the reference model
Reference = Callable[[dict[str, Any], torch.Tensor], torch.Tensor]

METRICS = (
    "rewards/chosen",
    "rewards/rejected",
    "rewards/margins",
    "rewards/accuracies",
    "logps/chosen",
    "logps/rejected",
)


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """``log(1 - exp(x))`` for ``x < 0``, split at ``-log 2`` where each form loses no precision."""
    return torch.where(x < -0.6931471805599453, torch.log1p(-torch.exp(x)), torch.log(-torch.expm1(x)))


def answer_sums(tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(summed log-probability of each row's labelled tokens, their count) from ``[rows, length - 1]`` per-token
    log-probabilities."""
    mask = labels[:, 1:] != IGNORE
    return (tokens * mask).sum(-1), mask.sum(-1)


def padded(sequences: list[tuple[list[int], list[int]]], pad_id: int, pad_to: int | None) -> dict[str, torch.Tensor]:
    """``input_ids``, ``labels`` and ``attention_mask`` of (ids, labels) ``sequences``, right-padded to one length."""
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


class PairObjective:
    """Owner of the run's objective under ``rl: dpo``, ``ipo``, ``orpo`` or ``simpo``.

    ``reference(inputs, targets)`` returns the reference model's per-token log-probabilities of ``targets``
    (the base with the adapter switched off, or a frozen copy of the model as loaded); None for ORPO and
    SimPO, which need none. ``head``: the model computes them through its chunked head (``logps``).
    """

    def __init__(self, config: Any, reference: Reference | None, device: Any, head: bool):
        self.loss_type = METHODS[config.rl]
        self.beta = config.rl_beta if config.rl_beta is not None else DEFAULT_BETA
        self.alpha = config.orpo_alpha if config.orpo_alpha is not None else DEFAULT_BETA
        self.gamma, self.cpo_alpha = config.simpo_gamma, config.cpo_alpha
        self.smoothing = config.dpo_label_smoothing
        self.reference, self.head = reference, head
        # precompute_ref_log_probs: each sample's reference (chosen, rejected) log-probabilities by its digest
        self.precomputed: dict[bytes, tuple[float, float]] | None = None
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
        batch = padded(chosen + rejected, pad_id, pad_to)
        if self.precomputed is not None:
            values = [self.precomputed[sample_key(s.input_ids, s.labels)] for (s,) in rows]
            batch["ref_logps"] = torch.tensor([c for c, _ in values] + [r for _, r in values], dtype=torch.float32)
        return batch

    def loss(self, model: Any, batch: dict[str, Any], num_items: float) -> torch.Tensor:
        """The pairs' summed loss over ``num_items``, from one forward of the policy (and one of the reference)."""
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"], "use_cache": False}
        labels, targets = batch["labels"], batch["labels"]
        pairs = len(labels) // 2
        if self.loss_type == "orpo":  # its NLL is that of the whole chosen sequence, prompt included
            whole = batch["input_ids"][:pairs].masked_fill(batch["attention_mask"][:pairs] == 0, IGNORE)
            targets = torch.cat([whole, labels[pairs:]])
        tokens = token_logps(model, inputs, targets, self.head)
        logps, counts = answer_sums(tokens, labels)
        if self.loss_type in ("orpo", "simpo"):
            total, shown = self._reference_free(tokens, targets, logps / counts.clamp(min=1))
        else:
            if "ref_logps" in batch:  # precompute_ref_log_probs
                ref_logps = batch["ref_logps"]
            else:
                with torch.no_grad():
                    ref_logps, _ = answer_sums(self.reference(inputs, labels), labels)
            total, shown = self._against_reference(logps, ref_logps, counts)
        if torch.is_grad_enabled():  # training, not evaluation: the metrics of the logged window
            self._record(*(value.detach() for value in shown))
        return total / num_items

    def _against_reference(self, logps: Any, ref_logps: Any, counts: Any) -> tuple[torch.Tensor, tuple]:
        """DPO (sigmoid, with conservative DPO's smoothing) or IPO; rewards are beta times the log-ratios."""
        chosen, rejected = logps.chunk(2)
        ref_chosen, ref_rejected = ref_logps.chunk(2)
        chosen_ratio, rejected_ratio = chosen - ref_chosen, rejected - ref_rejected
        if self.loss_type == "ipo":  # TRL's IPO: log-ratios averaged over each answer's tokens
            chosen_count, rejected_count = counts.chunk(2)
            delta = chosen_ratio / chosen_count.clamp(min=1) - rejected_ratio / rejected_count.clamp(min=1)
            losses = (delta - 1 / (2 * self.beta)) ** 2
        else:
            losses = self._sigmoid(chosen_ratio - rejected_ratio)
        return losses.sum(), (self.beta * chosen_ratio, self.beta * rejected_ratio, chosen, rejected)

    def _reference_free(self, tokens: Any, targets: Any, mean_logps: Any) -> tuple[torch.Tensor, tuple]:
        """ORPO (TRL's ORPOTrainer) or SimPO (TRL's CPOTrainer): from the answers' mean log-probabilities, plus
        the NLL of the chosen sequences' targets as a token mean over the micro-batch, counted once a pair."""
        chosen, rejected = mean_logps.chunk(2)
        pairs = len(chosen)
        if self.loss_type == "orpo":
            log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
            losses, weight, scale = -self.alpha * F.logsigmoid(log_odds), 1.0, self.alpha
        else:  # SimPO: the target margin gamma, and cpo_alpha times the NLL of the chosen answers
            losses = self._sigmoid(chosen - rejected - self.gamma / self.beta)
            weight, scale = self.cpo_alpha, self.beta
        total = losses.sum()
        if weight:
            nll = -tokens[:pairs].sum() / (targets[:pairs, 1:] != IGNORE).sum()
            total = total + weight * nll * pairs
        return total, (scale * chosen, scale * rejected, chosen, rejected)

    def _sigmoid(self, delta: torch.Tensor) -> torch.Tensor:
        """``-log sigmoid(beta delta)``, with the share ``dpo_label_smoothing`` of the pairs taken as flipped."""
        losses = -F.logsigmoid(self.beta * delta) * (1 - self.smoothing)
        if self.smoothing:
            losses = losses - F.logsigmoid(-self.beta * delta) * self.smoothing
        return losses

    def _record(self, good: Any, bad: Any, chosen: Any, rejected: Any) -> None:
        values = [good, bad, good - bad, (good > bad).float(), chosen, rejected]
        pairs = torch.tensor([float(len(chosen))], dtype=torch.float64, device=chosen.device)
        self.sums += torch.cat([torch.stack([v.sum().double() for v in values]), pairs])

    def metrics(self) -> dict[str, float]:
        """TRL's rewards/* and logps/* over the pairs trained since the last call, on every rank."""
        totals = distributed.all_reduce_sum([float(v) for v in self.sums], self.device)
        self.sums.zero_()
        pairs = max(totals[-1], 1.0)
        return {name: value / pairs for name, value in zip(METRICS, totals[:-1], strict=True)}


def adapter_off(model: Any, head: bool) -> Reference:
    """The reference of an adapter run: ``model`` (a peft model) with its adapter switched off."""

    def reference(inputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        with model.disable_adapter():
            return token_logps(model, inputs, targets, head)

    return reference


def frozen(copy: Any, head: bool) -> Reference:
    """The reference of full fine-tuning: a frozen copy of the model as loaded."""
    copy.eval()
    copy.requires_grad_(False)

    def reference(inputs: dict[str, torch.Tensor], targets: torch.Tensor) -> torch.Tensor:
        return token_logps(copy, inputs, targets, head)

    return reference
