"""What a DeepSpeed JSON object says about the run: ZeRO stage, offload, 16-bit gathering, compile.

Plain reads of the dict (DeepSpeed's own spellings and aliases), usable before torch is imported.
"""

from __future__ import annotations

from typing import Any

import attrs

from ktrain_deepspeed.links import get

OFFLOAD_DEVICES = ("cpu", "nvme")
LEGACY_COMPILE_KEYS = frozenset({"disable", "backend", "kwargs"})


def stage(settings: dict[str, Any]) -> Any:
    """``zero_optimization.stage`` as written (DeepSpeed's default is 0, no ZeRO)."""
    found = get(settings, "zero_optimization.stage")
    return 0 if found is None else found


def offloads_optimizer(settings: dict[str, Any]) -> bool:
    """Whether the optimizer state lives on the CPU or NVMe (DeepSpeed then wants its CPU Adam)."""
    return get(settings, "zero_optimization.offload_optimizer.device") in OFFLOAD_DEVICES


def offloads_params(settings: dict[str, Any]) -> bool:
    return get(settings, "zero_optimization.offload_param.device") in OFFLOAD_DEVICES


def forces_ds_cpu_optimizer(settings: dict[str, Any]) -> bool:
    """DeepSpeed's ``zero_force_ds_cpu_optimizer`` (default true): an offloaded optimizer must be its CPU Adam."""
    return settings.get("zero_force_ds_cpu_optimizer", True) is not False


def gathers_16bit(settings: dict[str, Any]) -> bool:
    """ZeRO-3's ``gather_16bit_weights_on_model_save`` (also spelled with a ``stage3_`` prefix)."""
    for name in ("gather_16bit_weights_on_model_save", "stage3_gather_16bit_weights_on_model_save"):
        if get(settings, f"zero_optimization.{name}") is True:
            return True
    return False


@attrs.frozen
class LegacyCompile:
    """The ``compile`` section as older DeepSpeed releases spelled it: ``disable``, ``backend``, ``kwargs``.

    Current DeepSpeed rejects these keys; they meant "torch.compile the model with ``backend``", which
    ktrain applies through ``DeepSpeedEngine.compile``.
    """

    enabled: bool
    backend: str
    kwargs: dict[str, Any]


def legacy_compile(settings: dict[str, Any]) -> LegacyCompile | None:
    """The older ``compile`` section, or None when there is none (or it uses today's keys)."""
    section = settings.get("compile")
    if not isinstance(section, dict) or not section or not set(section) <= LEGACY_COMPILE_KEYS:
        return None
    return LegacyCompile(
        enabled=section.get("disable", False) is False,
        backend=section.get("backend", "inductor"),
        kwargs=dict(section.get("kwargs") or {}),
    )


def for_deepspeed(settings: dict[str, Any]) -> dict[str, Any]:
    """The dict handed to DeepSpeed: without the older ``compile`` section, which ktrain applies itself."""
    if legacy_compile(settings) is None:
        return settings
    return {name: value for name, value in settings.items() if name != "compile"}
