"""The ``zero-redundancy`` checkpoint format: the trained weights, and the optimizer state gathered whole.

Rank 0 writes ``model.safetensors`` (the parameters that train and the buffers; frozen parameters are
rebuilt from ``base_model`` on resume), ``optimizer.pt`` (every rank's share, gathered: so a checkpoint
resumes on any number of ranks, each keeping its new share) and ``scheduler.pt``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from ktrain_zero_redundancy.engine import ZeroRedundancyEngine
from ktrain_zero_redundancy.entry import FORMAT


def trained_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The tensors a checkpoint holds: trainable parameters (tied ones once) and buffers."""
    names = {n for n, p in model.named_parameters() if p.requires_grad} | {n for n, _ in model.named_buffers()}
    return {k: v.detach().contiguous() for k, v in model.state_dict().items() if k in names}


def save(engine: ZeroRedundancyEngine, run: Any, path: Path) -> dict[str, Any]:
    """Write the checkpoint into ``path`` (collective: every rank sends its optimizer share)."""
    optimizer = engine.full_optimizer_state()
    if run.is_main:
        save_file(trained_state(engine.model), str(path / "model.safetensors"))
        torch.save(optimizer, path / "optimizer.pt")
        torch.save(engine.lr_scheduler.state_dict(), path / "scheduler.pt")
    return {"format": FORMAT}


def load(engine: ZeroRedundancyEngine, run: Any, path: Path, manifest: dict[str, Any]) -> bool:
    """Restore weights, this rank's optimizer share and the schedule from ``path``."""
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"resume: {path} is a '{manifest.get('format')}' checkpoint of {manifest.get('plugin_distribution')}; "
            f"zero_redundancy reads '{FORMAT}' checkpoints. Resume with the plugin that wrote it."
        )
    state = load_file(path / "model.safetensors", device=str(run.device))
    lacking = trained_state(engine.model).keys() - state.keys()
    if lacking:
        raise ValueError(f"resume: {path} lacks {', '.join(sorted(lacking)[:3])}; it was written for another model")
    engine.model.load_state_dict(state, strict=False)
    engine.optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=run.device, weights_only=True))
    engine.lr_scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    return True


def read_state_dict(path: Path, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The model state of a checkpoint, for ``ktrain export`` (no process group needed)."""
    return load_file(path / "model.safetensors")
