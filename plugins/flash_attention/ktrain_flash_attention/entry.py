"""Entry module of ktrain-plugin-flash-attention: the ``flash_attention_4`` key and the checks before launch.

Imports nothing heavy: torch and flash-attn-4 are imported by the runtime object, activated only when
``flash_attention_4`` is true. ``ktrain run`` refuses the key written true before any rank starts where the
ranks would use a CPU, a GPU outside compute capability 9.x and 10.x, or an attention other than SDPA and
FlexAttention, or where flash-attn-4 is not installed.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain.config.fast_defaults import attention
from ktrain_flash_attention.keys import ATTENTION, CAPABILITIES, INSTALL, OFF, FlashAttentionKeys, installed


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``flash_attention_4``."""
    register(FlashAttentionKeys)


@hookimpl
def ktrain_validate_config(config: Any, report: Any, launch: Any) -> None:
    """The attention, the package and the device, where ``flash_attention_4`` is true."""
    if not config.flash_attention_4:
        return
    name = "flash_attention_4"
    if attention(config) not in ATTENTION:
        wanted = "attn_implementation: sdpa or flex_attention"
        report.error(name, f"runs under {wanted}, not {attention(config)}; remove one of the two")
    if not installed() and not (launch is not None and launch.planned):
        message = f"needs flash-attn-4, which is not installed here: {INSTALL}; or {OFF}"
        (report.error if launch is not None and launch.device == "cuda" else report.warn)(name, message)
    if launch is None or launch.device is None:
        report.warn(name, "needs a GPU of compute capability 9.x or 10.x; `ktrain run` refuses it elsewhere")
    elif launch.device != "cuda":
        report.error(name, f"needs a GPU of compute capability 9.x or 10.x; this run's ranks would use the CPU; {OFF}")
    elif launch.capability is not None and launch.capability[0] not in CAPABILITIES:
        major, minor = launch.capability
        report.error(name, f"needs a GPU of compute capability 9.x or 10.x; this one is {major}.{minor}; {OFF}")


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """In one rank's memory model: FlashAttention-4 saves what SDPA's other fused kernels save."""
    return {"attention": "flash_attention_4"} if config.flash_attention_4 else None


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Put FlashAttention-4's kernels behind SDPA, claiming ``op:sdpa_flash``."""
    if config.flash_attention_4:
        runtime = "ktrain_flash_attention.runtime:FlashAttention4"
        activate(runtime, roles=("op:sdpa_flash",), keys=("flash_attention_4",))
