"""Default owner of ``checkpoint_format``: full model and optimizer state, written by rank 0.

For one process and DDP, where every rank holds the whole model: ``model.safetensors`` (safetensors'
``save_model`` keeps tied weights once), ``optimizer.pt`` and ``scheduler.pt``. A checkpoint of this
format resumes on any number of ranks.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, load_model, save_model

from ktrain import hookimpl

FORMAT = "ktrain-full"


def read_state_dict(path: Path, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model state of a checkpoint of this format, for ``ktrain export`` (tied weights appear once)."""
    return load_file(path / "model.safetensors")


class LocalCheckpoint:
    """Saves and restores the whole model, optimizer and scheduler from rank 0's copy."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_save_checkpoint(self, engine: Any, run: Any, path: Path) -> dict[str, Any]:
        if run.is_main:
            save_model(engine.model, str(path / "model.safetensors"))
            torch.save(engine.optimizer.state_dict(), path / "optimizer.pt")
            torch.save(engine.lr_scheduler.state_dict(), path / "scheduler.pt")
        return {"format": FORMAT}

    @hookimpl(trylast=True)
    def ktrain_load_checkpoint(self, engine: Any, run: Any, path: Path, manifest: dict[str, Any]) -> bool:
        if manifest.get("format") != FORMAT:
            raise ValueError(
                f"resume: {path} is a '{manifest.get('format')}' checkpoint written by {manifest.get('plugin')}; "
                f"this run saves '{FORMAT}' (no sharding plugin). Enable the plugin that wrote it."
            )
        load_model(engine.model, str(path / "model.safetensors"), device=str(run.device))
        engine.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=run.device, weights_only=False))
        engine.lr_scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=False))
        return True
