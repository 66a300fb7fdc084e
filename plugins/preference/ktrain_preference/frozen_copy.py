"""The frozen reference copy of full fine-tuning: the model as loaded, then placed by the sharding owner.

The copy is taken whole (``frozen_copy``) and handed to the owner of ``sharding`` (``ktrain_shard_frozen``),
which shards it as the policy is (FSDP2, ZeRO-3) or keeps it whole on every rank (one process, DDP, FSDP1,
ZeRO-1/2). A model built inside DeepSpeed's ``zero.Init`` (ZeRO-3) holds only this rank's partition of each
parameter, so a plain deep copy would hold empty placeholders: its parameters are gathered one at a time
(read-only, every rank) into plain frozen parameters in host memory, which ZeRO-3 then partitions again; a
tied weight stays one parameter. Any other model is deep-copied as it is.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch.distributed.tensor import DTensor


def _partitioned(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters DeepSpeed's ZeRO-3 partitioned (they carry a ``ds_id``)."""
    return [p for p in model.parameters() if hasattr(p, "ds_id")]


def frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A copy of ``model`` with its parameters whole and without gradients, in eval mode."""
    partitioned = _partitioned(model)
    if not partitioned:
        whole = copy.deepcopy(model)
    else:
        import deepspeed

        memo: dict[int, Any] = {}
        for p in model.parameters():  # one parameter gathered at a time: the device never holds the whole model
            with deepspeed.zero.GatheredParameters([p] if hasattr(p, "ds_id") else [], modifier_rank=None):
                memo[id(p)] = torch.nn.Parameter(p.detach().to("cpu", copy=True))
        whole = copy.deepcopy(model, memo)
    whole.requires_grad_(False)
    return whole.eval()


def held(module: torch.nn.Module) -> tuple[int, int]:
    """(elements this rank holds, elements of the whole module) of ``module``'s parameters: a DTensor's local
    shard, a ZeRO-3 parameter's partition (and its whole tensor where ZeRO-3 keeps it gathered, ``ds_persist``),
    any other parameter whole."""
    mine = total = 0
    for p in module.parameters():
        if hasattr(p, "ds_id"):
            total += p.ds_numel
            mine += p.ds_tensor.numel() + (p.ds_numel if getattr(p, "ds_persist", False) else 0)
        elif isinstance(p, DTensor):
            total += p.numel()
            mine += p.to_local().numel()
        else:
            total += p.numel()
            mine += p.numel()
    return mine, total
