"""``ktrain.engine.Engine`` over a ``deepspeed.DeepSpeedEngine``: DeepSpeed owns the step.

Backward, the accumulation boundary, clipping (``gradient_clipping``) and the scheduler step are
DeepSpeed's. The kernel hands ``backward`` a loss already normalised for the whole global batch, so
DeepSpeed's own division by ``gradient_accumulation_steps`` is turned off (``scale_wrt_gas=False``);
DeepSpeed then averages gradients over the data-parallel ranks, as DDP does.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from typing import Any

import torch

from ktrain.engine import Engine


class DeepSpeedEngine(Engine):
    """The loop's view of a DeepSpeed engine (``ds``); ``model`` is the module it wraps.

    ``stage`` is the ZeRO stage; ``gather_16bit`` says the exported weights are the 16-bit ones ZeRO-3
    gathers (``gather_16bit_weights_on_model_save`` under bf16/fp16); otherwise they are the fp32
    master weights.
    """

    owns_backward = True
    owns_accumulation = True
    owns_clipping = True
    owns_scheduler = True

    def __init__(self, ds: Any, *, stage: int, gather_16bit: bool):
        super().__init__(ds, ds.module, ds.optimizer, ds.lr_scheduler, max_grad_norm=ds.gradient_clipping() or None)
        self.ds = ds
        self.stage = stage
        self.gather_16bit = gather_16bit

    @contextlib.contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        """DeepSpeed counts micro-batches in ``step()``; inside the accumulation that call only counts."""
        yield
        if not last:
            self.ds.step()

    def backward(self, loss: torch.Tensor) -> None:
        self.ds.backward(loss, scale_wrt_gas=False)

    def clip_grad_norm(self) -> float:
        """The global gradient norm DeepSpeed measured (and clipped to) in the last step."""
        norm = self.ds.get_global_grad_norm()
        return math.nan if norm is None else float(norm)

    def step(self) -> float:
        """The boundary micro-step: DeepSpeed reduces, clips, updates, steps the schedule and zeroes."""
        self.ds.step()
        return self.clip_grad_norm()

    def lr(self) -> float:
        return float(self.ds.get_lr()[0])

    def train(self, mode: bool = True) -> None:
        self.ds.train(mode)

    def _sixteen_bit(self) -> bool:
        return self.ds.bfloat16_enabled() or self.ds.fp16_enabled()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model on CPU on rank 0 ({} elsewhere); collective, every rank calls it.

        ZeRO-3 gathers the partitioned parameters; where they are 16-bit copies and the JSON does not ask
        for 16-bit weights, each trainable parameter is replaced by its fp32 master weight.
        """
        from deepspeed.utils import safe_get_full_fp32_param

        main = self.ds.global_rank == 0
        if self.stage == 3:
            state = self.ds._zero3_consolidated_16bit_state_dict() or {}
        else:
            state = {name: t.detach().cpu() for name, t in self.model.state_dict().items()} if main else {}
        if self._sixteen_bit() and not (self.stage == 3 and self.gather_16bit):
            for name, param in self.model.named_parameters(remove_duplicate=False):
                master = safe_get_full_fp32_param(param) if param.requires_grad else None  # collective under ZeRO
                if main and master is not None:
                    state[name] = master.detach().cpu()
        return state
