"""AdamW over fp32 master copies of bf16 weights: the optimizer ``adamw_fp32_master``."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import torch
from torch.distributed.tensor import DTensor

TRITON = importlib.util.find_spec("triton") is not None  # CUDA builds of torch bring it on Linux


def _local(t: torch.Tensor) -> torch.Tensor:
    """``t``, or a DTensor's local shard (a view: updating it updates the DTensor)."""
    return t.to_local() if isinstance(t, DTensor) else t


def _chunks(rows: list[list[torch.Tensor]], elements: int) -> Iterator[list[list[torch.Tensor]]]:
    """``rows`` (a weight and its tensors each) in runs whose weights add up to ``elements`` or just past it."""
    chunk: list[list[torch.Tensor]] = []
    total = 0
    for row in rows:
        chunk.append(row)
        total += row[0].numel()
        if total >= elements:
            yield chunk
            chunk, total = [], 0
    if chunk:
        yield chunk


class MasterWeightAdamW(torch.optim.Optimizer):
    """AdamW whose update runs on fp32 master copies of the model's bf16 weights.

    Under ``bfloat16: true`` the model's weights and gradients are bf16 and it computes in bf16 with no
    autocast casts. This optimizer keeps, for each weight, an fp32 master copy and fp32 first and
    second moments: with the bf16 weight and gradient, 16 bytes a parameter, what fp32 weights with
    autocast also take, so updates smaller than a bf16 weight's rounding step add up in the master
    instead of being lost. On a GPU one Triton kernel a weight of ``SMALL`` elements or more reads its
    bf16 gradient and writes its master, moments and bf16 weight (``master_weights_triton``). The smaller
    weights (an adapter's matrices, norms), and every weight elsewhere (or non-contiguous tensors, or
    without Triton), are updated in chunks of ``CHUNK`` elements with a few launches a chunk, whatever the
    number of weights in it: the chunk's gradients are cast to fp32, ``torch._fused_adamw_`` updates its
    masters and moments (the kernel of ``torch.optim.AdamW(fused=True)``), and the masters are rounded into
    the bf16 weights. The masters are optimizer state, so checkpoints hold them and a resume is exact.
    Sharded weights (FSDP2's DTensors) get sharded masters and moments; the update runs on the local shards.
    Gradient clipping hands its coefficient to ``scale_gradients`` and the update applies it as it reads
    each gradient, which saves the clipping's own pass over the gradients.
    """

    CHUNK = 1 << 26  # fp32 gradient elements made at a time (256 MiB)
    SMALL = 1 << 20  # on a GPU, weights below this many elements are updated together, not a launch each

    def __init__(self, params: Any, lr: float, betas: tuple[float, float], eps: float, weight_decay: float = 0.0):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay})
        self.grad_scale: torch.Tensor | None = None

    def scale_gradients(self, scale: torch.Tensor) -> None:
        """Multiply the gradients by ``scale`` (a 0-d tensor, e.g. the clipping coefficient) in the next step."""
        self.grad_scale = scale

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
        scale, self.grad_scale = self.grad_scale, None
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            states = [self._state(p) for p in params]
            if not params:
                continue
            torch._foreach_add_([s["step"] for s in states], 1)
            rows = [
                [
                    _local(p),
                    _local(s["master"]),
                    _local(p.grad),
                    _local(s["exp_avg"]),
                    _local(s["exp_avg_sq"]),
                    s["step"],
                ]
                for p, s in zip(params, states, strict=True)
            ]
            alone: list[list[torch.Tensor]] = []
            together = rows
            if params[0].device.type == "cuda" and TRITON:
                together = []
                for row in rows:
                    fits = row[0].numel() >= self.SMALL and all(t.is_contiguous() for t in row)
                    (alone if fits else together).append(row)
            if alone:
                from ktrain.builtin import master_weights_triton

                # largest first: while the device works through them, the host gets ahead with the small ones
                for row in sorted(alone, key=lambda row: -row[0].numel()):
                    master_weights_triton.update(*row, scale, group)
            if together:
                self._fused_update(group, together, scale)

    def _fused_update(self, group: dict, rows: list[list[torch.Tensor]], scale: torch.Tensor | None) -> None:
        """``torch._fused_adamw_`` on the masters, ``CHUNK`` elements of fp32 gradients at a time."""
        beta1, beta2 = group["betas"]
        for chunk in _chunks(rows, self.CHUNK):
            weights, masters, grads, exp_avgs, exp_avg_sqs, steps = (
                list(column) for column in zip(*chunk, strict=True)
            )
            given, grads = grads, [torch.empty_like(m) for m in masters]
            torch._foreach_copy_(grads, given)  # one launch casts them all
            if scale is not None:
                torch._foreach_mul_(grads, scale)
            torch._fused_adamw_(
                masters,
                grads,
                exp_avgs,
                exp_avg_sqs,
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
            torch._foreach_copy_(weights, masters)
