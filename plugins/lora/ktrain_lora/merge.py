"""``ktrain merge-lora RUN_DIR``: the base the run trained on, with its adapter merged in, as HF safetensors.

The base is rebuilt exactly as the run built it (the run's config, its model loader, its seed under
``random_init_weights``, the same quantization), dequantized to fp32 when it was 4-bit or 8-bit, and
the adapter (``final/``, or a checkpoint's through its format's reader) is merged into it in fp32. The
merged model therefore computes what the adapter model computed in training, up to rounding; for
QLoRA that is the *dequantized* 4-bit base plus the adapter (see the README on quantizing it again).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import Any

import peft
import torch

from ktrain.config.plan import Plan, prepare
from ktrain.config.report import ConfigError
from ktrain.run.checkpoints import read_checkpoint_state
from ktrain.run.context import Run, compute_dtype
from ktrain_lora.adapter import adapter_names, attach
from ktrain_lora.keys import adapter_kind, quantization_bits
from ktrain_lora.quantization import model_kwargs

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_base(run: Run) -> Any:
    """The frozen base as the run loaded it, through the run's ``model_loader``, dequantized to fp32."""
    config = run.config
    torch.manual_seed(config.seed)  # as every rank seeds before loading: random_init_weights gives the same base
    model = run.hook.ktrain_load_model(run=run, model_kwargs=model_kwargs(config, run.compute_dtype) or {})
    if quantization_bits(config) is not None:
        model = model.dequantize(dtype=torch.float32)
    return model.float().to(run.device)


def _adapter_from_checkpoint(base: Any, plan: Plan, checkpoint: Path) -> peft.PeftModel:
    state = read_checkpoint_state(plan.plugins, checkpoint)
    model = attach(base, plan.config)
    wanted = adapter_names(model)
    lacking = sorted(wanted - state.keys())
    if lacking:
        raise ConfigError.single("--checkpoint", f"{checkpoint} lacks adapter weights: {', '.join(lacking[:3])}")
    model.load_state_dict({k: state[k] for k in wanted}, strict=False)
    return model


def merge(run_dir: Path, checkpoint: Path | None, output: Path | None, dtype: str | None) -> Path:
    """Write the merged model of ``run_dir`` (its final adapter, or ``checkpoint``'s); return the folder."""
    plan = prepare(run_dir / "config.yaml", with_defaults=True)
    config = plan.config
    if adapter_kind(config) is None:
        raise ConfigError.single("RUN_DIR", f"{run_dir} is not an adapter run: its config sets no adapter")
    source = checkpoint or run_dir / "final"
    if checkpoint is None and not (source / "adapter_config.json").is_file():
        raise ConfigError.single("RUN_DIR", f"{source} holds no adapter; finish the run or name a --checkpoint")
    device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    run = Run.one_process(plan, run_dir, device)
    base = load_base(run)
    if checkpoint is None:
        model = peft.PeftModel.from_pretrained(base, source)
    else:
        model = _adapter_from_checkpoint(base, plan, checkpoint)
    merged = model.merge_and_unload()
    merged.to(DTYPES[dtype] if dtype else compute_dtype(config, device))
    output = output or run_dir / "merged"
    staging = output.with_name(f".tmp-{output.name}")
    shutil.rmtree(staging, ignore_errors=True)
    merged.save_pretrained(staging, safe_serialization=True)
    run.hook.ktrain_load_tokenizer(run=run).save_pretrained(staging)
    if output.exists():
        shutil.rmtree(output)
    staging.rename(output)
    return output


def merge_cli(run_dir: str, checkpoint: str | None, output: str | None, dtype: str | None) -> int:
    """The ``ktrain merge-lora`` command."""
    folder = merge(Path(run_dir), Path(checkpoint) if checkpoint else None, Path(output) if output else None, dtype)
    print(f"merged model written to {folder}", file=sys.stdout)
    return 0
