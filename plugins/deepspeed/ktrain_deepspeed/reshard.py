"""A ZeRO-3 checkpoint of N ranks resumed on M: each rank cuts its new partition out of the N saved ones.

ZeRO-3 partitions every parameter on its own: rank r of N holds elements ``[r*p, (r+1)*p)`` of the
flattened parameter, ``p = ceil(numel / N)``, the last partition padded with zeros, and a rank's flat
groups (fp32 master weights, Adam's two moments) are its partitions of the parameters of each
sub-group laid end to end, in the order of the checkpoint's ``param_shapes``. Reading the N optimizer
files memory-mapped, a rank of the new run gathers, parameter by parameter, only the slices its new
partition covers (no rank holds the whole model), lays them out in the new run's sub-groups, and hands
the result to DeepSpeed's own loader of one rank's state (``_rigid_load_state_dict``), which also
rebuilds the 16-bit partitions from the masters. The schedule, the step counters and the buffers come
from the model-state file of rank 0 (the same on every rank). Every file is read with
``weights_only=True``; the loss scaler's class and the stage's enum are allowed for it.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import torch

OPTIM_FILE = "zero_pp_rank_{rank}_mp_rank_00_optim_states.pt"
MODEL_FILE = "zero_pp_rank_0_mp_rank_00_model_states.pt"


def _read(path: Path) -> dict[str, Any]:
    """A DeepSpeed file, memory-mapped (a slice read touches only its pages), with ``weights_only=True``."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    with torch.serialization.safe_globals([LossScaler, DynamicLossScaler, ZeroStageEnum]):
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)


class SavedPartitions:
    """The flat groups of the N saved ranks, read as slices of whole parameters."""

    def __init__(self, folder: Path, ranks: int):
        self.ranks = ranks
        self.states = [_read(folder / OPTIM_FILE.format(rank=r))["optimizer_state_dict"] for r in range(ranks)]
        self.model_state = _read(folder / MODEL_FILE)
        first = self.states[0]["optimizer_state_dict"]["state"]  # sub-group i's state is entry i, as DeepSpeed keeps it
        sizes = [t.numel() for t in self.states[0]["fp32_flat_groups"]]
        self.moments = tuple(
            k for k, v in first[0].items() if torch.is_tensor(v) and v.numel() == sizes[0] and k != "step"
        )
        self.extras = {k: v for k, v in first[0].items() if k not in self.moments}  # Adam's step count
        self.where: dict[str, tuple[int, int, int, int]] = {}  # name -> (sub-group, offset, partition, numel)
        for sub, group in enumerate(self.model_state["param_shapes"]):
            offset = 0
            for name, shape in group.items():
                numel = math.prod(shape)
                self.where[name] = (sub, offset, math.ceil(numel / ranks), numel)
                offset += math.ceil(numel / ranks)

    def _flat(self, rank: int, sub: int, key: str) -> torch.Tensor:
        state = self.states[rank]
        if key == "fp32":
            return state["fp32_flat_groups"][sub].detach()
        return state["optimizer_state_dict"]["state"][sub][key]

    def piece(self, name: str, key: str, start: int, size: int) -> torch.Tensor:
        """Elements ``[start, start+size)`` of parameter ``name``'s flattened ``key`` (``fp32``, the master
        weights, or a moment), zeros past its end."""
        sub, offset, part, numel = self.where[name]
        out = torch.zeros(size, dtype=self._flat(0, sub, key).dtype)
        at, stop = start, min(start + size, numel)
        while at < stop:
            rank, inside = divmod(at, part)
            take = min(part - inside, stop - at)
            out[at - start : at - start + take] = self._flat(rank, sub, key)[offset + inside : offset + inside + take]
            at += take
        return out


def _rank_state(optimizer: Any, saved: SavedPartitions, rank: int) -> dict[str, Any]:
    """This rank's state as DeepSpeed's ``_rigid_load_state_dict`` takes it, cut from ``saved``."""
    names = optimizer.param_names
    missing = [names.get(p, "?") for group in optimizer.fp16_groups for p in group if names.get(p) not in saved.where]
    if missing:
        raise ValueError(f"the checkpoint holds no optimizer state of {', '.join(missing)}")
    flats: dict[str, list[torch.Tensor]] = {key: [] for key in ("fp32", *saved.moments)}
    for group in optimizer.fp16_groups:
        for key, out in flats.items():
            parts = [saved.piece(names[p], key, rank * p.partition_numel(), p.partition_numel()) for p in group]
            out.append(torch.cat(parts) if parts else torch.zeros(0))
    old = saved.states[0]
    order = sorted(range(len(optimizer.fp16_groups)), key=lambda sub: optimizer.sub_group_to_group_id[sub])
    index = {sub: i for i, sub in enumerate(order)}  # torch numbers the flats group by group
    groups = []
    for g, hyper in enumerate(old["optimizer_state_dict"]["param_groups"]):
        members = [index[sub] for sub in order if optimizer.sub_group_to_group_id[sub] == g]
        groups.append({**{k: v for k, v in hyper.items() if k != "params"}, "params": members})
    state = {
        index[sub]: {
            **{k: v.clone() if torch.is_tensor(v) else v for k, v in saved.extras.items()},
            **{key: flats[key][sub] for key in saved.moments},
        }
        for sub in range(len(optimizer.fp16_groups))
    }
    return {
        "loss_scaler": old["loss_scaler"],
        "dynamic_loss_scale": old["dynamic_loss_scale"],
        "overflow": old["overflow"],
        "optimizer_state_dict": {"state": state, "param_groups": groups},
        "fp32_flat_groups": flats["fp32"],
    }


def load(ds: Any, folder: Path, saved_ranks: int) -> None:
    """Restore the ZeRO-3 engine ``ds`` (its optimizer partitions, schedule, step counters and buffers) from
    the checkpoint tag folder ``folder`` written by ``saved_ranks`` ranks; every rank calls it."""
    import deepspeed.comm as dist

    saved = SavedPartitions(folder, saved_ranks)
    optimizer = ds.optimizer
    rank = dist.get_rank(group=optimizer.dp_process_group)
    optimizer.checkpoint_event_prologue()
    optimizer._rigid_load_state_dict(_rank_state(optimizer, saved, rank), load_optimizer_states=True)
    if optimizer.persistent_parameters:
        optimizer.persistent_parameters[0].partition(optimizer.persistent_parameters)
    optimizer.checkpoint_event_epilogue()
    model_state = saved.model_state
    buffers = dict(ds.module.named_buffers())
    for name in model_state.get("buffer_names") or ():
        buffers[name].data.copy_(model_state["module"][name])
    if ds.lr_scheduler is not None:
        ds.lr_scheduler.load_state_dict(model_state["lr_scheduler"])
    ds.global_steps = model_state["global_steps"]
    ds.global_samples = model_state.get("global_samples", ds.global_steps * ds.train_batch_size())
    ds.skipped_steps = model_state["skipped_steps"]
