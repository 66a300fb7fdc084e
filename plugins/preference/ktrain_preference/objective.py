"""The preference objective: a micro-batch of pairs in one forward, and their loss.

DPO and IPO are TRL's DPOTrainer's ``sigmoid`` (with conservative DPO's label smoothing) and ``ipo``
losses, from the summed log-probabilities of each answer's tokens under the policy and the reference
(computed without the full logits where the model allows: ``ktrain_preference.logps``);
ORPO is TRL's ORPOTrainer's and SimPO its CPOTrainer's ``simpo``, from the mean log-probabilities, with
the chosen sequences' NLL. A pair's prompt runs once for both answers where the model's attention
allows (``ktrain_preference.layout``), else its two sequences are two rows. A pair is one item: the loss
of a step is the mean over the pairs of the global batch (the NLL term of ORPO and SimPO is a token mean
within each micro-batch, as in TRL, weighted by its pairs). The rewards and log-probabilities TRL logs are
summed here over the pairs trained since the last logged step, and read (summed over the ranks) by ``metrics``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F

from ktrain.run import distributed
from ktrain_preference.keys import DEFAULT_BETA, METHODS
from ktrain_preference.layout import shared_rows, two_rows
from ktrain_preference.logps import group_sums, token_logps
from ktrain_preference.pairs import sample_key

# (inputs, at) -> the log-probabilities of the tokens ``at`` names (``ktrain_preference.logps``) under the reference
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


def model_inputs(batch: dict[str, Any]) -> dict[str, Any]:
    """The model's keyword arguments of a collated batch (``position_ids`` where the layout gives them)."""
    names = ("input_ids", "attention_mask", "position_ids")
    return {name: batch[name] for name in names if name in batch} | {"use_cache": False}


def answer_sums(values: torch.Tensor, batch: dict[str, Any]) -> torch.Tensor:
    """Each group's sum (``ktrain_preference.layout``) of the scored tokens' log-probabilities ``values``."""
    return group_sums(values, batch["logps_slots"], len(batch["answer_tokens"]), batch["input_ids"].shape[1])


class PairObjective:
    """Owner of the run's objective under ``rl: dpo``, ``ipo``, ``orpo`` or ``simpo``.

    ``reference(inputs, at)`` returns the reference model's log-probabilities of the tokens ``at`` names (the
    base with the adapter switched off, or a frozen copy of the model as loaded); None for ORPO and SimPO,
    which need none. ``head``: the model computes them through its chunked head (``logps``). ``attention``:
    the model's attention implementation where a pair's prompt can run once for both answers, else None
    (``ktrain_preference.layout``).
    """

    def __init__(self, config: Any, reference: Reference | None, device: Any, head: bool, attention: str | None):
        self.loss_type = METHODS[config.rl]
        self.beta = config.rl_beta if config.rl_beta is not None else DEFAULT_BETA
        self.alpha = config.orpo_alpha if config.orpo_alpha is not None else DEFAULT_BETA
        self.gamma, self.cpo_alpha = config.simpo_gamma, config.cpo_alpha
        self.smoothing = config.dpo_label_smoothing
        self.reference, self.head, self.attention = reference, head, attention
        # precompute_ref_log_probs: each sample's reference (chosen, rejected) log-probabilities by its digest
        self.precomputed: dict[bytes, tuple[float, float]] | None = None
        # what ran over the data before the first step (the precompute pass): name, seconds, items, unit
        self.passes: list[dict[str, Any]] = []
        self.sums = torch.zeros(len(METRICS) + 1, dtype=torch.float64, device=device)  # the metrics, then pairs

    def items(self, row: list[Any]) -> int:
        """A pair is one item."""
        return 1

    def collate(
        self, rows: list[list[Any]], pad_id: int, pad_to: int | None, packed_attention: str | None, device: Any
    ) -> dict[str, Any]:
        """A row a pair, prompt once for both answers, where the model's attention allows and ``pad_to`` is None;
        else the chosen sequences, then the rejected ones (``ktrain_preference.layout``)."""
        samples = [sample for (sample,) in rows]
        whole_chosen = self.loss_type == "orpo"  # its NLL is that of the whole chosen sequence, prompt included
        batch = None
        if self.attention is not None and pad_to is None:
            batch = shared_rows(samples, pad_id, self.attention, whole_chosen, device)
        if batch is None:
            batch = two_rows(samples, pad_id, pad_to, whole_chosen)
        if self.precomputed is not None:
            values = [self.precomputed[sample_key(s.input_ids, s.labels)] for s in samples]
            batch["ref_logps"] = torch.tensor([c for c, _ in values] + [r for _, r in values], dtype=torch.float32)
        return batch

    def answer_logps(self, model: Any, batch: dict[str, Any]) -> torch.Tensor:
        """Each group's summed log-probability under ``model``, from one call of it."""
        return answer_sums(token_logps(model, model_inputs(batch), batch["logps_at"], self.head), batch)

    def loss(self, model: Any, batch: dict[str, Any], num_items: float) -> torch.Tensor:
        """The pairs' summed loss over ``num_items``, from one forward of the policy (and one of the reference)."""
        sums, counts = self.answer_logps(model, batch), batch["answer_tokens"]
        pairs = len(counts) // (3 if self.loss_type == "orpo" else 2)
        if self.loss_type in ("orpo", "simpo"):
            total, shown = self._reference_free(sums, counts, pairs)
        else:
            if "ref_logps" in batch:  # precompute_ref_log_probs
                ref_logps = batch["ref_logps"]
            else:
                with torch.no_grad():
                    ref_logps = answer_sums(self.reference(model_inputs(batch), batch["logps_at"]), batch)
            total, shown = self._against_reference(sums, ref_logps, counts)
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

    def _reference_free(self, sums: Any, counts: Any, pairs: int) -> tuple[torch.Tensor, tuple]:
        """ORPO (TRL's ORPOTrainer) or SimPO (TRL's CPOTrainer): from the answers' mean log-probabilities, plus
        the NLL of the chosen sequences' scored tokens (ORPO's include the prompts') as a token mean over the
        micro-batch, counted once a pair."""
        chosen, rejected = (sums[: 2 * pairs] / counts[: 2 * pairs].clamp(min=1)).chunk(2)
        if self.loss_type == "orpo":
            log_odds = (chosen - rejected) - (_log1mexp(chosen) - _log1mexp(rejected))
            losses, weight, scale = -self.alpha * F.logsigmoid(log_odds), 1.0, self.alpha
        else:  # SimPO: the target margin gamma, and cpo_alpha times the NLL of the chosen answers
            losses = self._sigmoid(chosen - rejected - self.gamma / self.beta)
            weight, scale = self.cpo_alpha, self.beta
        total = losses.sum()
        if weight:
            nll = -(sums[:pairs].sum() + sums[2 * pairs :].sum()) / (counts[:pairs].sum() + counts[2 * pairs :].sum())
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
        pairs = torch.full((1,), float(len(chosen)), dtype=torch.float64, device=chosen.device)  # no host copy
        self.sums += torch.cat([torch.stack([v.sum().double() for v in values]), pairs])

    def metrics(self) -> dict[str, float]:
        """TRL's rewards/* and logps/* over the pairs trained since the last call, on every rank."""
        totals = distributed.all_reduce_sum([float(v) for v in self.sums])
        self.sums.zero_()
        pairs = max(totals[-1], 1.0)
        return {name: value / pairs for name, value in zip(METRICS, totals[:-1], strict=True)}


def adapter_off(model: Any, head: bool) -> Reference:
    """The reference of an adapter run: ``model`` (a peft model) with its adapter switched off."""

    def reference(inputs: dict[str, torch.Tensor], at: torch.Tensor) -> torch.Tensor:
        with model.disable_adapter():
            return token_logps(model, inputs, at, head)

    return reference


def frozen(copy: Any, head: bool) -> Reference:
    """The reference of full fine-tuning: a frozen copy of the model as loaded."""
    copy.eval()
    copy.requires_grad_(False)

    def reference(inputs: dict[str, torch.Tensor], at: torch.Tensor) -> torch.Tensor:
        return token_logps(copy, inputs, at, head)

    return reference
