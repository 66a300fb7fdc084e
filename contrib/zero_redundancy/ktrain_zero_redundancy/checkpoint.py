"""The ``zero-redundancy`` checkpoint format: the trained weights, and the optimizer state gathered whole.

Rank 0 writes the files of the kernel's own format (``ktrain.builtin.local_checkpoint.write_whole``):
``model.safetensors`` (the parameters that train and the buffers; frozen parameters are rebuilt from
``base_model`` on resume), ``optimizer.pt`` (every rank's share, gathered: so a checkpoint resumes on any
number of ranks, each keeping its new share) and ``scheduler.pt``. Its own format name keeps a run
without this plugin from reading the gathered optimizer state as a plain one.

torch is imported only when a checkpoint is written or read: the entry module names ``FORMAT`` from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ktrain_zero_redundancy.engine import ZeroRedundancyEngine

FORMAT = "zero-redundancy"


def save(engine: ZeroRedundancyEngine, run: Any, path: Path) -> dict[str, Any]:
    """Write the checkpoint into ``path`` (collective: every rank sends its optimizer share)."""
    from ktrain.builtin.local_checkpoint import write_whole

    optimizer = engine.full_optimizer_state()
    if run.is_main:
        write_whole(path, engine, optimizer)
    return {"format": FORMAT}


def load(engine: ZeroRedundancyEngine, run: Any, path: Path, manifest: dict[str, Any]) -> bool:
    """Restore weights, this rank's optimizer share and the schedule from ``path``."""
    if manifest.get("format") != FORMAT:
        raise ValueError(
            f"resume: {path} is a '{manifest.get('format')}' checkpoint of {manifest.get('plugin_distribution')}; "
            f"zero_redundancy reads '{FORMAT}' checkpoints. Resume with the plugin that wrote it."
        )
    from ktrain.builtin.local_checkpoint import read_whole

    read_whole(path, engine, run.device)
    return True
