"""``ktrain env``: what a bug report needs: versions, devices, distributed backends, NCCL settings, plugins."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

PACKAGES = (
    "ktrain-llm",
    "torch",
    "transformers",
    "accelerate",
    "safetensors",
    "tokenizers",
    "pluggy",
    "attrs",
    "cattrs",
    "deepspeed",
    "peft",
    "bitsandbytes",
    "liger-kernel",
    "flash-attn",
    "triton",
)


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def describe_environment() -> str:
    """A plain-text report of this machine as ktrain sees it."""
    import torch
    import torch.distributed as dist

    from ktrain.config.activation import discover

    lines = [f"python {sys.version.split()[0]} on {platform.platform()}", "", "packages:"]
    lines += [f"  {name}: {_version(name)}" for name in PACKAGES]
    lines += ["", "devices:"]
    if torch.cuda.is_available():
        lines.append(f"  CUDA {torch.version.cuda}, {torch.cuda.device_count()} GPU(s)")
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            lines.append(
                f"  cuda:{i} {props.name}, {props.total_memory / 2**30:.0f} GiB, sm_{props.major}{props.minor}"
            )
    else:
        lines.append(f"  no GPU; CPU with {os.cpu_count()} cores (runs use gloo)")
    lines += ["", "distributed backends:"]
    for name, available in (
        ("nccl", dist.is_nccl_available()),
        ("gloo", dist.is_gloo_available()),
        ("mpi", dist.is_mpi_available()),
    ):
        lines.append(f"  {name}: {'yes' if available else 'no'}")
    prefixes = ("NCCL_", "TORCH_NCCL", "CUDA_VISIBLE", "KTRAIN_", "GLOO_", "MASTER_", "PET_", "TORCH_DISTRIBUTED")
    settings = {k: v for k, v in os.environ.items() if k.startswith(prefixes)}
    lines += ["", "settings:"] + ([f"  {k}={v}" for k, v in sorted(settings.items())] or ["  (none set)"])
    lines += ["", "plugins:"]
    lines += [f"  {i.name}: {i.distribution} {i.version}" for i in discover().infos]
    return "\n".join(lines)
