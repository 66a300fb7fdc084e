"""The ``ktrain-dcp`` checkpoint format: torch.distributed.checkpoint shards, resumable at any world size.

Inside the kernel's staging folder (committed by the kernel's rename after every rank returned):

- ``dcp/``: the optimizer state and, under ``SHARDED_STATE_DICT`` (the default), the model's trainable
  parameters and persistent buffers, each rank writing its own shards;
- ``model.safetensors`` under ``FULL_STATE_DICT``: the same model state gathered whole by rank 0;
- ``scheduler.pt``: the learning-rate schedule (the same on every rank; rank 0 writes it).

Frozen parameters (a LoRA base) are not saved: a resumed run rebuilds them as the first run did.
``read_state_dict`` merges a checkpoint into one state dict on one CPU process, for ``ktrain export``.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file, save_file
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.metadata import TensorStorageMetadata
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from ktrain_fsdp.options import FsdpOptions

FORMAT = "ktrain-dcp"
DCP_DIR = "dcp"
MODEL_FILE = "model.safetensors"
SCHEDULER_FILE = "scheduler.pt"
WRAPPER_PREFIXES = ("_fsdp_wrapped_module.", "_checkpoint_wrapped_module.", "_orig_mod.")


def _clean(name: str) -> str:
    """A parameter's name as the state dict spells it (without FSDP1 and checkpoint wrappers)."""
    for prefix in WRAPPER_PREFIXES:
        name = name.replace(prefix, "")
    return name


def _frozen(model: torch.nn.Module) -> set[str]:
    return {_clean(n) for n, p in model.named_parameters(remove_duplicate=False) if not p.requires_grad}


def _tied_aliases(model: torch.nn.Module) -> set[str]:
    """Second names of shared parameters (a tied ``lm_head.weight``): written once in a safetensors file."""
    every = {_clean(n) for n, _ in model.named_parameters(remove_duplicate=False)}
    return every - {_clean(n) for n, _ in model.named_parameters()}


def _dcp(action: Any, state: dict[str, Any], folder: Path) -> None:
    # CheckpointException derives from BaseException: name it, or `except Exception` upstream misses it.
    try:
        action(state, checkpoint_id=folder)
    except CheckpointException as e:
        raise RuntimeError(f"torch.distributed.checkpoint failed on {folder}: {e}") from None


def save(engine: Any, run: Any, path: Path, options: FsdpOptions) -> dict[str, Any]:
    """Write the checkpoint into the staging folder ``path``, collectively; return the manifest facts."""
    model = engine.model
    frozen = _frozen(model)
    model_state, optim_state = get_state_dict(model, engine.optimizer)
    state: dict[str, Any] = {"optimizer": optim_state}
    if options.state_dict_type == "SHARDED_STATE_DICT":
        state["model"] = {k: v for k, v in model_state.items() if k not in frozen}
    else:
        full = engine.full_state_dict()
        if run.is_main:
            skip = frozen | _tied_aliases(model)
            save_file({k: v.contiguous() for k, v in full.items() if k not in skip}, str(path / MODEL_FILE))
    _dcp(dcp.save, state, path / DCP_DIR)
    if run.is_main:
        torch.save(engine.lr_scheduler.state_dict(), path / SCHEDULER_FILE)
    return {"format": FORMAT, "state_dict_type": options.state_dict_type, "fsdp_version": options.version}


def load(engine: Any, run: Any, path: Path, manifest: dict[str, Any]) -> None:
    """Restore model, optimizer and scheduler from the committed ``ktrain-dcp`` checkpoint ``path``."""
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"resume: {path} is a '{manifest.get('format')}' checkpoint written by {manifest.get('plugin')} "
            f"({manifest.get('plugin_distribution')}); this run shards with FSDP and resumes '{FORMAT}' checkpoints. "
            "Resume it with the config that wrote it."
        )
    model = engine.model
    frozen = _frozen(model)
    model_state, optim_state = get_state_dict(model, engine.optimizer)
    state: dict[str, Any] = {"optimizer": optim_state}
    sharded = manifest.get("state_dict_type") == "SHARDED_STATE_DICT"
    if sharded:
        state["model"] = {k: v for k, v in model_state.items() if k not in frozen}
    _dcp(dcp.load, state, path / DCP_DIR)
    set_state_dict(
        model,
        engine.optimizer,
        model_state_dict=state.get("model", {}),
        optim_state_dict=state["optimizer"],
        options=StateDictOptions(strict=False),
    )
    # FSDP1 (torch 2.13) drops the hyperparameters (lr, betas, ...) of all but the last of several param
    # groups when loading; they are in the checkpoint, in the optimizer's group order.
    for group, saved in zip(engine.optimizer.param_groups, state["optimizer"]["param_groups"], strict=True):
        for key, value in saved.items():
            if key != "params":
                group.setdefault(key, value)
    if not sharded:  # rank 0 reads the file and sends it (FSDP1 on CPU: every rank reads it, see FsdpEngine)
        send = engine.gather_to_rank0
        full = load_file(path / MODEL_FILE) if run.is_main or not send else {}
        set_model_state_dict(
            model, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=send, strict=False)
        )
    engine.lr_scheduler.load_state_dict(torch.load(path / SCHEDULER_FILE, weights_only=True))


def read_state_dict(path: Path, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model state of a ``ktrain-dcp`` checkpoint, merged on one process (no process group), for export."""
    if manifest.get("state_dict_type") == "FULL_STATE_DICT":
        return load_file(path / MODEL_FILE)
    folder = path / DCP_DIR
    metadata = dcp.FileSystemReader(folder).read_metadata()
    model: dict[str, torch.Tensor] = {}
    for key, item in metadata.state_dict_metadata.items():
        where = metadata.planner_data.get(key, ())  # ("model", "<parameter name>") for the model's entries
        if len(where) == 2 and where[0] == "model" and isinstance(item, TensorStorageMetadata):
            model[where[1]] = torch.empty(item.size, dtype=item.properties.dtype)
    with warnings.catch_warnings():  # "no process group: loading in a single process" is what is meant here
        warnings.simplefilter("ignore", UserWarning)
        _dcp(dcp.load, {"model": model}, folder)
    return model
