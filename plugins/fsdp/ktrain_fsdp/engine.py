"""The engine of a sharded run: the kernel owns the step; clipping and the full state dict know the shards."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from ktrain.engine import Engine


class FsdpEngine(Engine):
    """``ktrain.engine.Engine`` over an FSDP2 model (``module`` is ``model``) or an FSDP1 wrapper.

    FSDP averages gradients over the data-parallel ranks in its reduce-scatter, as DDP does, so the
    kernel's loss (normalised for the global batch) gives the gradient of the step's token-mean loss.
    """

    def __init__(self, *args: Any, version: int, device: torch.device, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.version = version
        # FSDP1 on CPU crashes (SIGSEGV) gathering to rank 0 only: there every rank gathers the whole model.
        self.gather_to_rank0 = version == 2 or device.type != "cpu"

    def clip_grad_norm(self) -> torch.Tensor | float:
        """The global norm over every shard (FSDP1: its own ``clip_grad_norm_``; FSDP2: DTensor norms)."""
        if self.version == 1:
            limit = self.max_grad_norm if self.max_grad_norm is not None else math.inf
            return self.module.clip_grad_norm_(limit)
        return super().clip_grad_norm()

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model gathered to CPU on rank 0 (collective: every rank calls it; others may get {})."""
        options = StateDictOptions(full_state_dict=True, cpu_offload=self.gather_to_rank0)
        return get_model_state_dict(self.model, options=options)
