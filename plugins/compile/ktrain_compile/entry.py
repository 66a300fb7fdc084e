"""Entry module of ktrain-plugin-compile: Axolotl's ``torch_compile`` keys, and the ``compile`` role.

Imports nothing heavy: torch is imported by the runtime object, activated only when ``torch_compile`` is
true, so that ``ktrain check`` stays light.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_compile.keys import MODES, PARALLEL_SIZES, CompileKeys


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``torch_compile``, ``torch_compile_backend`` and ``torch_compile_mode``."""
    register(CompileKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """A mode torch.compile does not have; compiled blocks with tensor, context or sequence parallelism; the
    compile keys set without ``torch_compile``."""
    if config.torch_compile_mode is not None and config.torch_compile_mode not in MODES:
        report.error(
            "torch_compile_mode", f"'{config.torch_compile_mode}' is not a mode of torch.compile ({', '.join(MODES)})"
        )
    if config.torch_compile:
        for name in PARALLEL_SIZES:  # -1 (the rest of the ranks) is a parallel size too
            if getattr(config, name, None) not in (None, 1):
                report.error(
                    "torch_compile",
                    f"is not supported with {name} other than 1 yet (under tensor parallelism the compiled blocks' "
                    "gradients differed from eager ones); remove torch_compile or the parallel size",
                )
    else:
        for name in ("torch_compile_backend", "torch_compile_mode"):
            if config.is_set(name):
                report.warn(name, "has no effect without torch_compile: true")


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Compile the blocks, claiming ``compile``."""
    if not config.torch_compile:
        return
    activate("ktrain_compile.runtime:BlockCompiler", roles=("compile",), keys=("torch_compile",))


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """What compiled blocks save in one rank's memory model (``ktrain_compile.memory``)."""
    from ktrain_compile.memory import collect_memory

    return collect_memory(config)
