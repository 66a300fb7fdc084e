"""KTO's objective (TRL's KTOTrainer, loss type ``kto``): single answers, desirable or not, against a reference.

The loss of a desirable answer is ``1 - sigmoid(beta (log-ratio - KL))``, of an undesirable one
``1 - sigmoid(beta (KL - log-ratio))``, weighted by ``kto_desirable_weight`` and ``kto_undesirable_weight``;
the log-ratio is the answer's summed log-probability under the policy minus under the reference. KL, the
reference point, is estimated as TRL does: each row's prompt is given the answer of another row of the
micro-batch (a rotation by one), the mean of those mismatched answers' log-ratios is averaged over the
ranks, clamped at 0, and carries no gradient. The rows of a micro-batch are put in the order of their
token ids before the rotation, so the estimate depends on which rows a micro-batch holds, not on their
order. A row is one item: the loss of a step is the mean over the rows of the global batch.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

from ktrain.data.formats import IGNORE
from ktrain.run import distributed
from ktrain_preference.keys import DEFAULT_BETA
from ktrain_preference.layout import padded
from ktrain_preference.logps import group_sums, shifted, token_logps
from ktrain_preference.objective import Reference
from ktrain_preference.unpaired import answer_of

METRICS = ("rewards/chosen", "rewards/rejected", "logps/chosen", "logps/rejected")


def _row_sums(values: torch.Tensor, at: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Each row's sum of its labelled tokens' log-probabilities ``values`` (scored at ``at``, ``shifted(labels)``)."""
    return group_sums(values, at[:2], len(labels), labels.shape[1])


class UnpairedObjective:
    """Owner of the run's objective under ``rl: kto``; ``reference`` and ``head`` as for ``PairObjective``."""

    def __init__(self, config: Any, reference: Reference, device: Any, head: bool):
        self.beta = config.rl_beta if config.rl_beta is not None else DEFAULT_BETA
        self.weights = (config.kto_desirable_weight, config.kto_undesirable_weight)
        self.limit = config.sequence_len
        self.reference, self.head = reference, head
        # the metrics' sums, the desirable and undesirable rows, the KL estimates and their count
        self.sums = torch.zeros(len(METRICS) + 4, dtype=torch.float64, device=device)

    def items(self, row: list[Any]) -> int:
        """A row (one answer) is one item."""
        return 1

    def collate(
        self, rows: list[list[Any]], pad_id: int, pad_to: int | None, packed_attention: str | None, device: Any
    ) -> dict[str, Any]:
        """The rows' sequences, their mismatched ones (``kl_*``) and ``desirable``, right-padded."""
        samples = sorted(([int(t) for t in s.input_ids], [int(t) for t in s.labels]) for (s,) in rows)
        answers = [(ids, *answer_of(labels)) for ids, labels in samples]
        matched, mismatched = [], []
        for i, (ids, start, _) in enumerate(answers):
            matched.append((ids, [IGNORE] * start + ids[start:]))
            other, other_start, _ = answers[i - 1]
            kl_ids = (ids[:start] + other[other_start:])[: self.limit]
            mismatched.append((kl_ids, ([IGNORE] * start + other[other_start:])[: self.limit]))
        batch = padded(matched, pad_id, pad_to)
        batch.update({f"kl_{name}": value for name, value in padded(mismatched, pad_id, pad_to).items()})
        batch["desirable"] = torch.tensor([good for _, _, good in answers], dtype=torch.bool)
        # the scored tokens, found here on the host: on the device, finding them would make the host wait for it
        batch["logps_at"], batch["kl_logps_at"] = shifted(batch["labels"]), shifted(batch["kl_labels"])
        return batch

    def loss(self, model: Any, batch: dict[str, Any], num_items: float) -> torch.Tensor:
        """The rows' summed weighted losses over ``num_items``."""
        inputs, kl_inputs = (
            {"input_ids": batch[f"{p}input_ids"], "attention_mask": batch[f"{p}attention_mask"], "use_cache": False}
            for p in ("", "kl_")
        )
        at, kl_at = batch["logps_at"], batch["kl_logps_at"]
        with torch.no_grad():
            kl_logps = _row_sums(token_logps(model, kl_inputs, kl_at, self.head), kl_at, batch["kl_labels"])
            ref_kl_logps = _row_sums(self.reference(kl_inputs, kl_at), kl_at, batch["kl_labels"])
            ref_logps = _row_sums(self.reference(inputs, at), at, batch["labels"])
            kl = self._kl((kl_logps - ref_kl_logps).mean())
        logps = _row_sums(token_logps(model, inputs, at, self.head), at, batch["labels"])
        ratios = logps - ref_logps
        good = batch["desirable"]  # masks, not indexing: selecting the rows would make the host wait for the device
        desirable = torch.where(good, self.weights[0] * (1 - F.sigmoid(self.beta * (ratios - kl))), 0.0)
        undesirable = torch.where(good, 0.0, self.weights[1] * (1 - F.sigmoid(self.beta * (kl - ratios))))
        if torch.is_grad_enabled():  # training, not evaluation: the metrics of the logged window
            self._record(self.beta * ratios.detach(), logps.detach(), good, kl)
        return (desirable.sum() + undesirable.sum()) / num_items

    @staticmethod
    def _kl(local: torch.Tensor) -> torch.Tensor:
        """The mean over the ranks of their micro-batches' KL estimates, clamped at 0."""
        if dist.is_initialized() and dist.get_world_size() > 1:
            local = local.clone()
            dist.all_reduce(local)
            local = local / dist.get_world_size()
        return local.clamp(min=0)

    def _record(self, rewards: Any, logps: Any, good: Any, kl: Any) -> None:
        values = [torch.where(rows, v, 0.0).sum() for v in (rewards, logps) for rows in (good, ~good)]
        counts = [good.sum(), (~good).sum(), kl, torch.ones_like(kl)]
        self.sums += torch.stack([v.double() for v in values + counts])

    def metrics(self) -> dict[str, float]:
        """TRL's rewards/*, logps/* and kl over the rows trained since the last call, on every rank."""
        totals = distributed.all_reduce_sum([float(v) for v in self.sums])
        self.sums.zero_()
        (chosen, rejected, chosen_logps, rejected_logps, good, bad, kl, calls) = totals
        out = {"kl": kl / max(calls, 1.0)}
        if good:
            out.update({"rewards/chosen": chosen / good, "logps/chosen": chosen_logps / good})
        if bad:
            out.update({"rewards/rejected": rejected / bad, "logps/rejected": rejected_logps / bad})
        if good and bad:
            out["rewards/margins"] = out["rewards/chosen"] - out["rewards/rejected"]
        return out
