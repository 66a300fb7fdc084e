"""The frozen reference copy of full fine-tuning: the model as loaded, whole on every rank.

A model built inside DeepSpeed's ``zero.Init`` (ZeRO-3) holds only this rank's partition of each parameter,
so a plain deep copy would hold empty placeholders. Its parameters are gathered whole for the moment of the
copy (read-only, every rank), and the copy takes plain frozen parameters in their place; a tied weight stays
one parameter. Any other model is deep-copied as it is.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


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

        with deepspeed.zero.GatheredParameters(partitioned, modifier_rank=None):
            memo: dict[int, Any] = {id(p): torch.nn.Parameter(p.detach().clone()) for p in model.parameters()}
        whole = copy.deepcopy(model, memo)
    whole.requires_grad_(False)
    return whole.eval()
