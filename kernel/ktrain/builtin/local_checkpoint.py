"""Default owner of ``checkpoint_format``: the model's trained state and the optimizer, written by rank 0.

For one process and DDP, where every rank holds the whole model: ``model.safetensors`` (the parameters
that train, tied weights once, and the buffers), ``optimizer.pt`` and ``scheduler.pt``. Frozen parameters
(an adapter's base) are not saved: a resumed run rebuilds them from ``base_model`` as the first run did.
For a full fine-tune that is the whole model. A checkpoint of this format resumes on any number of ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ktrain import hookimpl

FORMAT = "ktrain-full"


def saved_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """What a checkpoint holds of ``model``: trainable parameters (tied ones once) and persistent buffers."""
    state = model.state_dict()
    names = {n for n, p in model.named_parameters() if p.requires_grad} | {n for n, _ in model.named_buffers()}
    return {k: v.detach().contiguous() for k, v in state.items() if k in names}


def read_state_dict(path: Path, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model state of a checkpoint of this format, for ``ktrain export`` (tied weights appear once)."""
    return load_file(path / "model.safetensors")


def write_whole(path: Path, engine: Any, optimizer_state: dict[str, Any]) -> None:
    """Write ``model.safetensors`` (``saved_state``), ``optimizer.pt`` and ``scheduler.pt`` into ``path``.

    Called on the rank that writes; ``optimizer_state`` is the whole optimizer's state (a sharding
    plugin gathers it first). Plugins that keep the whole model on every rank reuse this format.
    """
    save_file(saved_state(engine.model), str(path / "model.safetensors"))
    torch.save(optimizer_state, path / "optimizer.pt")
    torch.save(engine.lr_scheduler.state_dict(), path / "scheduler.pt")


def read_whole(path: Path, engine: Any, device: torch.device) -> None:
    """Restore what ``write_whole`` wrote into ``engine``; a model that lacks a saved tensor is refused."""
    state = load_file(path / "model.safetensors", device=str(device))
    lacking = saved_state(engine.model).keys() - state.keys()
    if lacking:
        raise ValueError(f"resume: {path} lacks {', '.join(sorted(lacking)[:3])}; it was written for another model")
    engine.model.load_state_dict(state, strict=False)
    engine.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    engine.lr_scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))


class LocalCheckpoint:
    """Saves and restores the whole model, optimizer and scheduler from rank 0's copy."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_save_checkpoint(self, engine: Any, run: Any, path: Path) -> dict[str, Any]:
        if run.is_main:
            write_whole(path, engine, engine.optimizer.state_dict())
        return {"format": FORMAT}

    @hookimpl(trylast=True)
    def ktrain_load_checkpoint(self, engine: Any, run: Any, path: Path, manifest: dict[str, Any]) -> bool:
        if manifest.get("format") != FORMAT:
            raise ValueError(
                f"resume: {path} is a '{manifest.get('format')}' checkpoint written by {manifest.get('plugin')}; "
                f"this run saves '{FORMAT}' (no sharding plugin). Enable the plugin that wrote it."
            )
        read_whole(path, engine, run.device)
        return True
