"""``optimizer: muon``: torch's Muon on the hidden weight matrices, AdamW on the rest, as Axolotl's Muon.

Muon (``torch.optim.Muon``: momentum 0.95 with Nesterov, the update orthogonalized by Newton-Schulz, its
learning rate scaled by ``max(1, rows / columns) ** 0.5``) trains each 2-D weight of the model's body;
AdamW trains the input embeddings and the output layer (without weight decay, as Axolotl's Muon), the norms,
biases and any weight of more than two dimensions. Both take ``learning_rate``; Muon takes the group's
``weight_decay``, AdamW ``adam_beta1``, ``adam_beta2`` and ``adam_epsilon``. The two live in one
``torch.optim.Optimizer`` with one state and one list of groups, so the scheduler sets both learning rates
and a checkpoint's ``optimizer.pt`` holds Muon's momentum beside AdamW's moments.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ktrain import hookimpl

MOMENTUM = 0.95
"""Muon's momentum (Axolotl's ``mu`` and torch's default)."""


class MuonAdamW(torch.optim.Optimizer):
    """``torch.optim.Muon`` over ``muon_groups`` and ``torch.optim.AdamW`` over ``adamw_groups``, stepped
    together; their groups and state are this optimizer's (what ``state_dict`` saves and loads)."""

    def __init__(self, muon_groups: list[dict], adamw_groups: list[dict], *, lr: float, betas: tuple, eps: float):
        muon_groups = [g for g in muon_groups if g["params"]]
        adamw_groups = [g for g in adamw_groups if g["params"]]
        self._parts: list[torch.optim.Optimizer] = []
        if muon_groups:
            self._parts.append(torch.optim.Muon(muon_groups, lr=lr, momentum=MOMENTUM, nesterov=True))
        if adamw_groups:
            self._parts.append(torch.optim.AdamW(adamw_groups, lr=lr, betas=betas, eps=eps))
        self._sizes = [len(part.param_groups) for part in self._parts]
        super().__init__([g for part in self._parts for g in part.param_groups], defaults={})
        self._link()

    def _link(self) -> None:
        """Point each part at its slice of this optimizer's groups and at this optimizer's state."""
        start = 0
        for part, size in zip(self._parts, self._sizes, strict=True):
            part.param_groups = self.param_groups[start : start + size]
            part.state = self.state
            start += size

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load groups and state as any optimizer does, then hand them to the parts again."""
        super().load_state_dict(state_dict)
        self._link()

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        """One Muon step and one AdamW step."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for part in self._parts:
            part.step()
        return loss


def build(params: Any, config: Any, adamw: tuple[torch.Tensor, ...] = ()) -> MuonAdamW:
    """Muon for the 2-D parameters of ``params`` (parameter groups) not in ``adamw``, AdamW for the rest;
    ``adamw``'s parameters (the embeddings and the output layer) without weight decay."""
    kept = {id(p) for p in adamw}
    muon, rest, embeddings = [], [], []
    for group in params:
        hidden = [p for p in group["params"] if p.ndim == 2 and id(p) not in kept]
        muon.append({**group, "params": hidden})
        rest.append({**group, "params": [p for p in group["params"] if p.ndim != 2 and id(p) not in kept]})
        embeddings += [p for p in group["params"] if id(p) in kept]
    rest.append({"params": embeddings, "weight_decay": 0.0})
    betas = (config.adam_beta1, config.adam_beta2)
    return MuonAdamW(muon, rest, lr=config.learning_rate, betas=betas, eps=config.adam_epsilon)


class MuonBuilder:
    """Owns the ``optimizer`` role for ``optimizer: muon``: builds it knowing the model's embeddings and
    output layer (``run.model``, as sharded), which AdamW trains."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl
    def ktrain_build_optimizer(self, params: Any, run: Any) -> torch.optim.Optimizer:
        """``build`` with the input and output embeddings' parameters kept for AdamW."""
        modules = [run.model.get_input_embeddings(), run.model.get_output_embeddings()]
        adamw = tuple(p for m in modules if m is not None for p in m.parameters())
        return build(params, self.config, adamw)
