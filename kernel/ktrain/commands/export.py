"""``ktrain export RUN_DIR``: a committed checkpoint, of any registered format, as HF safetensors.

``ktrain.run.checkpoints.read_checkpoint_state`` verifies every file, then the reader registered for the
format named in the manifest (``ktrain_register_checkpoint_formats``) reads the state; the kernel builds the
model from the run's config, loads the state, and writes it with the tokenizer, into a temporary folder
renamed into place when complete.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from ktrain.config.plan import load_plugins_and_config
from ktrain.config.report import ConfigError
from ktrain.run.checkpoints import checkpoint_root, complete_checkpoints, read_checkpoint_state


def export(run_dir: Path, checkpoint: Path | None, output: Path | None) -> Path:
    """Write the checkpoint (default: the latest complete one) of ``run_dir`` as safetensors; return the folder."""
    import torch
    import transformers

    plugins, config = load_plugins_and_config(run_dir / "config.yaml", [])
    if checkpoint is None:
        found = complete_checkpoints(checkpoint_root(run_dir))
        if not found:
            raise ConfigError.single("RUN_DIR", f"{run_dir} has no complete checkpoint to export")
        checkpoint = found[-1]
    state = read_checkpoint_state(plugins, checkpoint)
    output = output or run_dir / f"export-{checkpoint.name}"
    model_config = transformers.AutoConfig.from_pretrained(config.base_model_config or config.base_model)
    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(model_config)
    model.load_state_dict(state, strict=False, assign=True)
    model.tie_weights()
    missing = [name for name, p in model.named_parameters() if p.is_meta]
    if missing:
        raise ConfigError.single("--checkpoint", f"{checkpoint} lacks weights: {', '.join(missing[:5])}")
    staging = output.with_name(f".tmp-{output.name}")
    shutil.rmtree(staging, ignore_errors=True)
    model.save_pretrained(staging, safe_serialization=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(config.tokenizer_config or config.base_model)
    tokenizer.save_pretrained(staging)
    if output.exists():
        shutil.rmtree(output)
    staging.rename(output)
    return output


def export_cli(run_dir: str, checkpoint: str | None, output: str | None) -> int:
    """The ``ktrain export`` command."""
    folder = export(Path(run_dir), Path(checkpoint) if checkpoint else None, Path(output) if output else None)
    print(f"exported to {folder}", file=sys.stdout)
    return 0
