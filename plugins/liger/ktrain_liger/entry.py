"""Entry module of ktrain-plugin-liger: one key per Liger op, and each op a claimed role.

Imports nothing heavy: liger-kernel (and Triton) are imported by the runtime object, which is
activated only when a ``liger_*`` key is true. Each op it patches is the role ``op:<name>``, so two
plugins that patch one op stop the run before it starts, both named.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_liger.keys import OPS, LigerKeys, requested

KTRAIN_ROLES = tuple(f"op:{op}" for op in dict.fromkeys(OPS.values()))


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare the ``liger_*`` keys."""
    register(LigerKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any, launch: Any) -> None:
    """Conflicting spellings and ops, and the device: ``ktrain run`` on ranks without CUDA is refused before they
    start, ``ktrain check`` (which may run anywhere) warns. The architecture is checked on the ranks."""
    chosen = requested(config)
    if chosen and (launch is None or launch.device != "cuda"):
        message = (
            f"Liger's kernels need a CUDA GPU (enabled by {', '.join(chosen)}); remove the liger_* keys for a "
            "run without one"
        )
        if launch is not None and launch.device == "cpu":
            report.error(next(iter(chosen)), message + ": the ranks of this run would use the CPU")
        else:
            report.warn(next(iter(chosen)), message + "; `ktrain run` refuses it where no CUDA device is visible")
    if config.liger_swiglu is not None and config.is_set("liger_glu_activation"):
        if config.liger_swiglu != config.liger_glu_activation:
            report.error("liger_swiglu", "contradicts liger_glu_activation, its newer spelling; keep one")
        else:
            report.warn("liger_swiglu", "is the older spelling of liger_glu_activation; keep one")
    if config.liger_cross_entropy and config.liger_fused_linear_cross_entropy:
        report.error(
            "liger_cross_entropy",
            "liger_fused_linear_cross_entropy already computes the loss; set one of the two",
        )
    if config.liger_flce_chunk_mem_const < 1:
        report.error("liger_flce_chunk_mem_const", "must be a whole number of at least 1 (Liger's default is 1)")
    elif config.liger_flce_chunk_mem_const != 1 and not config.liger_fused_linear_cross_entropy:
        report.error("liger_flce_chunk_mem_const", "sizes liger_fused_linear_cross_entropy's chunks; set that key too")


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Patch the requested ops, claiming ``op:<name>`` for each."""
    chosen = requested(config)
    if not chosen:
        return
    ops = tuple(dict.fromkeys(chosen.values()))
    activate("ktrain_liger.entry:runtime", roles=tuple(f"op:{op}" for op in ops), keys=tuple(chosen))


def runtime(config: Any) -> Any:
    """The runtime object patching the requested ops (imports liger-kernel): built by the kernel on the ranks."""
    from ktrain_liger.runtime import Liger

    return Liger(config, requested(config))


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """In one rank's memory model: the patched ops save less for backward, and the fused linear cross
    entropy holds no whole-sequence logits."""
    ops = set(requested(config).values())
    if not ops:
        return None
    answer: dict[str, Any] = {"kernels": frozenset(ops - {"fused_linear_cross_entropy"})}
    if "fused_linear_cross_entropy" in ops:
        answer["loss"] = "fused"
    return answer
