"""``Run``: what every runtime hook receives about the run it takes part in."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import torch

from ktrain.config.model import Config
from ktrain.mesh import MeshPlan
from ktrain.resolve import Plan


@attrs.define
class Run:
    """The run as seen from one rank.

    ``device_mesh`` is a ``torch.distributed.DeviceMesh`` with the named dimensions of ``mesh`` (None
    in a one-process run); ``compute_dtype`` is what autocast computes in (fp32: no autocast);
    ``log`` is rank 0's metrics log (``log.write(step, metrics)``), set when the loop starts.
    """

    plan: Plan
    output_dir: Path
    rank: int
    local_rank: int
    world_size: int
    device: torch.device
    device_mesh: Any
    compute_dtype: torch.dtype
    tokenizer: Any = None
    model: Any = None
    log: Any = None
    step: int = 0

    @property
    def config(self) -> Config:
        return self.plan.config

    @property
    def pad_id(self) -> int:
        """The id that pads rows: the tokenizer's pad token, else 0 (also with no tokenizer, as ``ktrain bench``
        on random tokens runs)."""
        tokenizer = self.tokenizer
        return tokenizer.pad_token_id if tokenizer is not None and tokenizer.pad_token_id is not None else 0

    @property
    def mesh(self) -> MeshPlan:
        return self.plan.mesh

    @property
    def hook(self) -> Any:
        return self.plan.plugins.hook

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def one_process(cls, plan: Plan, output_dir: Path, device: torch.device, device_mesh: Any = None) -> Run:
        """The run as the only process sees it (``ktrain bench``, ``merge-lora``): rank 0 of 1."""
        return cls(
            plan=plan,
            output_dir=output_dir,
            rank=0,
            local_rank=0,
            world_size=1,
            device=device,
            device_mesh=device_mesh,
            compute_dtype=compute_dtype(plan.config, device),
        )

    def dp_rank(self) -> int:
        """This rank's index among the ranks that see different data (replicas × shards)."""
        if self.device_mesh is None:
            return 0
        dims = self.mesh.dims
        rep = self.device_mesh["dp_replicate"].get_local_rank() if dims["dp_replicate"] > 1 else 0
        shard = self.device_mesh["dp_shard"].get_local_rank() if dims["dp_shard"] > 1 else 0
        return rep * dims["dp_shard"] + shard


def compute_dtype(config: Any, device: torch.device) -> torch.dtype:
    """bf16 / fp16 autocast, or fp32; ``bf16: auto`` means bf16 on a GPU that supports it; ``bfloat16``: bf16."""
    if config.bfloat16:
        return torch.bfloat16
    if config.bf16 == "auto":
        return torch.bfloat16 if device.type == "cuda" and torch.cuda.is_bf16_supported() else torch.float32
    if config.bf16:
        return torch.bfloat16
    if config.fp16:
        return torch.float16
    return torch.float32


def weight_dtype(config: Any) -> torch.dtype:
    """The dtype the model's weights load in: fp32 master weights, or bf16 under ``bfloat16: true``."""
    return torch.bfloat16 if config.bfloat16 else torch.float32
