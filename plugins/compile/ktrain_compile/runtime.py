"""The runtime object of ``torch_compile: true``: each transformer block's forward compiled in place.

Only the block's ``forward`` is replaced (an instance attribute), not the module: parameter names, the
state dict and checkpoints stay as they were, and the hooks that other plugins put on the block (FSDP2's
gathers, activation checkpointing) run around the compiled code, eagerly. The blocks share one compiled
graph: dynamo treats the parameters of a built-in module as inputs, so the second block of the same class
reuses the first one's code (checked by the plugin's tests).
"""

from __future__ import annotations

from typing import Any

import torch

from ktrain import hookimpl
from ktrain.config.report import ConfigError, Report


def blocks(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The model's transformer blocks: the modules whose class is in one of its ``_no_split_modules``."""
    names = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    return [module for module in model.modules() if type(module).__name__ in names]


class BlockCompiler:
    """Owner of ``compile``: compiles each block after tensor/sequence parallelism, before sharding."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> None:
        """Stop before the model loads when the backend is not one torch.compile has."""
        backend = self.config.torch_compile_backend
        known = torch._dynamo.list_backends(exclude_tags=())
        if backend not in known:
            report = Report(self.config.source)
            report.error(
                "torch_compile_backend", f"torch.compile has no backend '{backend}' (it has: {', '.join(known)})"
            )
            raise ConfigError(report)

    @hookimpl(trylast=True)
    def ktrain_parallelize(self, model: torch.nn.Module, run: Any) -> None:
        """Replace each block's forward by its compiled version (last: after the other plugins' plans)."""
        found = blocks(model)
        if not found:
            report = Report(self.config.source)
            report.error(
                "torch_compile", f"{type(model).__name__} names no transformer blocks (_no_split_modules) to compile"
            )
            raise ConfigError(report)
        backend, mode = self.config.torch_compile_backend, self.config.torch_compile_mode
        for block in found:
            block.forward = torch.compile(block.forward, backend=backend, mode=mode)
        if run.is_main:
            print(f"compile: {len(found)} {type(found[0]).__name__} blocks ({backend})", flush=True)
