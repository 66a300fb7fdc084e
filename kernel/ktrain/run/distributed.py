"""The process group and device mesh of a run: NCCL on GPUs, gloo on CPUs."""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from ktrain.config.mesh import MeshPlan

PG_TIMEOUT_S = int(os.environ.get("KTRAIN_PG_TIMEOUT_S", "1800"))


def rank_env() -> tuple[int, int, int]:
    """(rank, local_rank, world_size) from the launcher's environment; (0, 0, 1) without one."""
    return (int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("WORLD_SIZE", 1)))


def pick_device(local_rank: int) -> torch.device:
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def _restart_store(timeout: datetime.timedelta):
    """After a restart (``--max-restarts``), the agent's store under a prefix of this attempt, else None.

    The elastic agent keeps one store for all attempts, so the addresses the ranks of the failed attempt
    published are still there; a restarted rank that read one would connect to a dead peer.
    """
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt == "0" or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False, timeout=timeout)
    return dist.PrefixStore(f"ktrain/attempt-{attempt}", store)


def init(mesh: MeshPlan, device: torch.device):
    """Start the process group (when more than one rank) and build the named device mesh."""
    if mesh.world_size == 1:
        return None
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        timeout = datetime.timedelta(seconds=PG_TIMEOUT_S)
        store = _restart_store(timeout)
        if store is None:
            dist.init_process_group(backend, timeout=timeout)
        else:
            rank, _, world = rank_env()
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
    from torch.distributed.device_mesh import init_device_mesh

    names = tuple(mesh.dims)
    return init_device_mesh(device.type, tuple(mesh.dims.values()), mesh_dim_names=names)


def submesh(device_mesh, dims: tuple[str, ...]):
    """The part of ``device_mesh`` over the named ``dims``, flattened into one dimension when several."""
    if len(dims) == 1:
        return device_mesh[dims[0]]
    return device_mesh[dims]._flatten("_".join(dims))


def barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


def all_reduce_sum(values: list[float]) -> list[float]:
    """Sum ``values`` over all ranks (``values`` themselves in one process)."""
    return _all_reduce(values, dist.ReduceOp.SUM)


def all_reduce_max(values: list[float]) -> list[float]:
    """The largest of each of ``values`` over all ranks (``values`` themselves in one process)."""
    return _all_reduce(values, dist.ReduceOp.MAX)


_host_group: Any = None
"""Where the process group is NCCL: a gloo group of every rank, for the values the host holds."""


def _all_reduce(values: list[float], op: Any) -> list[float]:
    """``values`` reduced over all ranks between the hosts (gloo): through NCCL the reduction would queue behind the
    GPU's work and the host would wait for it all (each step, the whole backward), leaving the GPU idle while it
    then queues the next work."""
    global _host_group
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return values
    if _host_group is None and dist.get_backend() != "gloo":
        _host_group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=PG_TIMEOUT_S))
    t = torch.tensor(values, dtype=torch.float64)
    dist.all_reduce(t, op=op, group=_host_group)
    return t.tolist()


def gather_lists(items: list[str]) -> list[str]:
    """Every rank's ``items`` joined, on every rank (``items`` itself in one process)."""
    if not dist.is_initialized():
        return items
    out: list[list[str] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(out, items)
    return [item for part in out for item in part or []]


def shutdown() -> None:
    global _host_group
    if dist.is_initialized():
        dist.destroy_process_group()  # every group, the gloo one beside NCCL too
    _host_group = None
