"""AdamW over fp32 master copies of bf16 weights: the optimizer ``adamw_fp32_master``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor


def _local(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a DTensor's local shard (a view: updating it updates the DTensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def _chunks(params: list[torch.Tensor], elements: int) -> Iterator[list[torch.Tensor]]:
    chunk: list[torch.Tensor] = []
    size = 0
    for p in params:
        chunk.append(p)
        size += p.numel()
        if size >= elements:
            yield chunk
            chunk, size = [], 0
    if chunk:
        yield chunk


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW whose update runs on fp32 master copies of the model's bf16 weights.

    Under ``bfloat16: true`` the model's weights and gradients are bf16 and it computes in bf16 with no
    autocast casts. This optimizer keeps, for each weight, an fp32 master copy and fp32 first and
    second moments: with the bf16 weight and gradient, 16 bytes a parameter, what fp32 weights with
    autocast also take, so updates smaller than a bf16 weight's rounding step add up in the master
    instead of being lost. A step walks the weights in chunks of ``CHUNK`` elements: the chunk's
    gradients are cast to fp32, ``torch._fused_adamw_`` updates its masters and moments (the kernel
    ``torch.optim.AdamW(fused=True)`` runs), and the masters are rounded into the bf16 weights. The
    masters are optimizer state, so checkpoints hold them and a resume is exact. Sharded weights
    (FSDP2's DTensors) get sharded masters and moments; the update runs on the local shards.
    """

    CHUNK = 1 << 26  # fp32 gradient elements made at a time (256 MiB)

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], eps: float, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})

    def _state(self, p: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[p]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=p.device)
            state["master"] = p.detach().to(torch.float32, copy=True)
            state["exp_avg"] = torch.zeros_like(state["master"])
            state["exp_avg_sq"] = torch.zeros_like(state["master"])
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restore the state; the masters, moments and steps stay fp32 (torch casts state to the weight's dtype)."""
        super().load_state_dict(state_dict)
        ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for i, p in zip(ids, params, strict=True):
            if i in state_dict["state"]:
                self.state[p] = {k: v.to(p.device, copy=True) for k, v in state_dict["state"][i].items()}

    @torch.no_grad()
    def step(self, closure: Any = None) -> None:
        """Update the masters from the bf16 gradients and round them into the weights."""
        if closure is not None:
            raise ValueError("adamw_fp32_master takes no closure")
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for chunk in _chunks([p for p in group["params"] if p.grad is not None], self.CHUNK):
                states = [self._state(p) for p in chunk]
                steps = [s["step"] for s in states]
                masters = [_local(s["master"]) for s in states]
                torch._foreach_add_(steps, 1)
                torch._fused_adamw_(
                    masters,
                    [_local(p.grad).float() for p in chunk],
                    [_local(s["exp_avg"]) for s in states],
                    [_local(s["exp_avg_sq"]) for s in states],
                    [],
                    steps,
                    lr=group["lr"],
                    beta1=beta1,
                    beta2=beta2,
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    amsgrad=False,
                    maximize=False,
                )
                torch._foreach_copy_([_local(p) for p in chunk], masters)
