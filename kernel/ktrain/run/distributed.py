"""The process group and device mesh of a run: NCCL on GPUs, gloo on CPUs."""

from __future__ import annotations

import datetime
import os

import torch
import torch.distributed as dist

from ktrain.mesh import MeshPlan

PG_TIMEOUT_S = int(os.environ.get("KTRAIN_PG_TIMEOUT_S", "1800"))


def rank_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the launcher's environment; (0, 0, 1) without one."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init(mesh: MeshPlan, device: torch.device):
    """Start the process group (when more than one rank) and build the named device mesh."""
    if mesh.world_size == 1:
        return None
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    from torch.distributed.device_mesh import init_device_mesh

    names = tuple(mesh.dims)
    return init_device_mesh(device.type, tuple(mesh.dims.values()), mesh_dim_names=names)


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: list[float], device: torch.device) -> list[float]:
    """Sum ``values`` over all ranks (a no-op in one process)."""
    if not dist.is_initialized():
        return values
    t = torch.tensor(values, dtype=torch.float64, device=device)
    dist.all_reduce(t)
    return t.tolist()


def shutdown() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
