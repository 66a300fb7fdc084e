"""The runtime object of a run with Liger kernels: checks before the model loads, then the patching.

Registered by the entry module only when a ``liger_*`` key is true; liger-kernel is imported inside
its hooks, so that ``ktrain check`` stays light.
"""

from __future__ import annotations

import functools
from typing import Any

from ktrain import hookimpl
from ktrain.config.report import ConfigError, Report


class Liger:
    """Owner of the ``op:*`` roles of the requested ops; patches the bare model before any adapter wraps it."""

    def __init__(self, config: Any, requested: dict[str, str]):
        self.config = config
        self.requested = requested

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> None:
        """Stop before the model loads when the architecture lacks an op, or when there is no CUDA GPU."""
        from ktrain_liger.patch import model_type, unsupported

        report = Report(self.config.source)
        kind = model_type(self.config)
        for name, reason in unsupported(kind, self.requested).items():
            report.error(name, reason)
        if not report.errors and run.device.type != "cuda":
            first = next(iter(self.requested))
            report.error(first, "Liger kernels need a CUDA GPU; remove the liger_* keys for a CPU run")
        if report.errors:
            raise ConfigError(report)

    @hookimpl(tryfirst=True)
    def ktrain_wrap_model(self, model: Any, run: Any) -> None:
        """Patch the requested ops into ``model`` in place (first, so that an adapter wraps the patched model)."""
        from ktrain_liger.patch import patch

        done = patch(model, set(self.requested.values()))
        const = self.config.liger_flce_chunk_mem_const
        if "fused_linear_cross_entropy" in done and const != 1:
            model.register_forward_pre_hook(functools.partial(_with_chunk_mem_const, const), with_kwargs=True)
            done["fused_linear_cross_entropy"] += f", chunk_mem_const {const}"
        if run.is_main:
            print(f"liger: {', '.join(f'{op} ({what})' for op, what in done.items())}", flush=True)


def _with_chunk_mem_const(const: int, module: Any, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """Forward pre-hook: Liger's patched forward hands ``chunk_mem_const`` on to its fused loss."""
    return args, {**kwargs, "chunk_mem_const": const}
