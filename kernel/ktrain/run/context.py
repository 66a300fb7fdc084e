"""``Run``: what every runtime hook receives about the run it takes part in."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import attrs
import torch
import torch.distributed as dist

from ktrain.config.mesh import MeshPlan
from ktrain.config.model import Config
from ktrain.config.run_plan import Plan
from ktrain.run.distributed import submesh

GRADIENT_DIMS = ("dp_replicate", "dp_shard", "cp")
"""Mesh dimensions whose ranks hold the same weights and train on other tokens: gradients are averaged over them."""


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

    def process_group(self, *dims: str) -> Any:
        """The process group over the mesh dimensions ``dims`` (several are flattened into one), on every rank.

        None in a one-process run. Every rank must ask for the same groups in the same order (making one is
        collective). An unknown name raises ``ValueError`` listing the mesh's dimensions.
        """
        unknown = [d for d in dims if d not in self.mesh.dims]
        if not dims or unknown:
            raise ValueError(f"no mesh dimension {unknown or list(dims)}; the mesh has {', '.join(self.mesh.dims)}")
        if self.device_mesh is None:
            return None
        return submesh(self.device_mesh, dims).get_group()

    @property
    def gradient_group(self) -> Any:
        """The process group over which gradients are averaged: ``dp_replicate`` x ``dp_shard`` x ``cp``.

        Its size is ``mesh.gradient_ranks``; the default group when that is every rank, None in a
        one-process run.
        """
        if self.device_mesh is None:
            return None
        if self.mesh.copies == 1:
            return dist.group.WORLD
        return self.process_group(*(tuple(d for d in GRADIENT_DIMS if self.mesh.dims[d] > 1) or ("dp_replicate",)))

    def say(self, message: str) -> None:
        """Print ``message`` to the user as one line ``ktrain: MESSAGE`` on rank 0 (other ranks print nothing).

        Line breaks in ``message`` become spaces. On a terminal the line replaces the progress bar, which the
        next logged step draws again below it.
        """
        if not self.is_main:
            return
        line = " ".join(message.split())
        print(("\r\033[K" if sys.stdout.isatty() else "") + f"ktrain: {line}", flush=True)


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
