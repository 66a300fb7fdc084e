"""DeepSpeed's own checkpoint format inside the kernel's run directory, and its reader for ``ktrain export``.

Every rank writes its ZeRO partition with ``DeepSpeedEngine.save_checkpoint`` under the tag folder
``deepspeed/`` of the kernel's staging folder (the kernel commits it with a manifest and a rename).
It holds the trainable parameters and buffers, the optimizer (fp32 master weights and moments) and the
scheduler; frozen parameters are left out (a resumed run rebuilds them from ``base_model``). A ZeRO
checkpoint resumes under the stage that wrote it; a ZeRO-3 one on any number of ranks (each rank cuts
its new partition out of the saved ones, ``ktrain_deepspeed.reshard``), a ZeRO-1/2 one on the number
that wrote it. ``ktrain export`` consolidates the fp32 weights on one CPU process with DeepSpeed's
``zero_to_fp32``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from ktrain.config.report import ConfigError
from ktrain_deepspeed import reshard
from ktrain_deepspeed.accelerator import load_deepspeed

FORMAT = "deepspeed"
TAG = "deepspeed"


def save(engine: Any, path: Path) -> dict[str, Any]:
    """Write ``engine``'s state into ``path`` (collective); return the manifest's facts."""
    deepspeed = load_deepspeed()
    engine.ds.save_checkpoint(str(path), tag=TAG, save_latest=False, exclude_frozen_parameters=True)
    return {"format": FORMAT, "tag": TAG, "zero_stage": engine.stage, "deepspeed": deepspeed.__version__}


def load(engine: Any, run: Any, path: Path, manifest: dict[str, Any]) -> bool:
    """Restore ``engine`` from ``path``; a ``ConfigError`` says why a checkpoint cannot resume this run."""
    if manifest.get("format") != FORMAT:
        raise ConfigError.single(
            "--resume",
            f"{path} is a '{manifest.get('format')}' checkpoint written by {manifest.get('plugin')}; this run "
            f"saves '{FORMAT}' (deepspeed is set). Resume it with the plugin that wrote it, or start afresh",
        )
    if manifest.get("zero_stage") != engine.stage:
        raise ConfigError.single(
            "--resume",
            f"{path} was written under ZeRO stage {manifest.get('zero_stage')}; this run uses stage "
            f"{engine.stage}. Resume with the same zero_optimization.stage",
        )
    saved_ranks = manifest.get("world_size")
    if saved_ranks != run.world_size and engine.stage == 3:
        reshard.load(engine.ds, path / manifest.get("tag", TAG), saved_ranks)
        return True
    if saved_ranks != run.world_size:
        raise ConfigError.single(
            "--resume",
            f"{path} holds ZeRO-{engine.stage} partitions of {saved_ranks} ranks; this run has {run.world_size}, "
            f"and only a ZeRO-3 checkpoint reshards. Resume with --nproc-per-node {saved_ranks}, or `ktrain "
            "export` it and start a new run from the exported model",
        )
    frozen = any(not p.requires_grad for p in engine.model.parameters())
    loaded, _ = engine.ds.load_checkpoint(
        str(path),
        tag=manifest.get("tag", TAG),
        load_module_strict=not frozen,
        load_optimizer_states=True,
        load_lr_scheduler_states=True,
    )
    if loaded is None:
        raise ConfigError.single("--resume", f"DeepSpeed found no checkpoint under {path / manifest.get('tag', TAG)}")
    return True


def read_state_dict(path: Path, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The fp32 weights of a checkpoint, consolidated from every rank's partition (``ktrain export``)."""
    load_deepspeed()
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    state = get_fp32_state_dict_from_zero_checkpoint(str(path), tag=manifest.get("tag", TAG))
    return {name: tensor.clone() for name, tensor in state.items()}  # own storage: the reader hands out views
