"""Entry module of ktrain-plugin-fp8: Axolotl's ``fp8`` keys and the plugin's own, and the checks before launch.

Imports nothing heavy: torch and torchao are imported by the runtime object, activated only when ``fp8`` is
true. ``ktrain run`` refuses ``fp8`` before any rank starts on a CPU or on a GPU before compute capability
8.9 (no float8 tensor cores), and a combination with a key whose plugin cannot work with float8 layers is
an error naming both keys.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_fp8.keys import MIN_CAPABILITY, Fp8Keys, excluded

# keys whose plugins change the linear layers or the weights in ways torchao's float8 layers were not
# checked with: each, when set, is refused beside fp8 with the reason
REFUSED_WITH = {
    "deepspeed": "DeepSpeed partitions and casts the weights itself; shard with fsdp_version: 2",
    "adapter": "an adapter's frozen base layers are not trained in float8 here; train the full model",
    "load_in_4bit": "quantized base weights have no float8 path here",
    "load_in_8bit": "quantized base weights have no float8 path here",
    "tensor_parallel_size": "tensor-parallel layers are not converted to float8 yet",
    "context_parallel_size": "context parallelism was not checked with float8 layers",
    "sequence_parallel_degree": "sequence parallelism was not checked with float8 layers",
}
# the losses that multiply the output layer's weight themselves, without its forward
FUSED_OUTPUT = ("fused_linear_cross_entropy", "liger_fused_linear_cross_entropy")
# where such a loss can run the output layer's products in float8 itself
FLOAT8_HEAD = {"fused_linear_cross_entropy": " (fused_linear_cross_entropy_fp8: true runs its products in float8)"}


def fsdp_version(config: Any) -> int | None:
    """The FSDP version the run shards with (1 when FSDP is asked for without a version), or None."""
    section = getattr(config, "fsdp_config", None)
    inner = section and (getattr(section, "fsdp_version", None) or getattr(section, "version", None))
    version = getattr(config, "fsdp_version", None) or inner
    if version is None and (section is not None or getattr(config, "fsdp", None)):
        return 1
    return version


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``fp8``, ``fp8_recipe``, ``fp8_amax_history_len``, ``fp8_fast_accumulation``, ``fp8_fused_mlp``,
    ``fp8_exclude_modules``, ``fp8_skip_small_layers`` and ``fp8_enable_fsdp_float8_all_gather``."""
    register(Fp8Keys)


def _check_device(config: Any, report: Any, launch: Any) -> None:
    """Refuse a launch on a CPU or an older GPU; warn where the device is not known."""
    if launch is None or launch.device is None:
        report.warn("fp8", "needs a GPU of compute capability 8.9 or later; `ktrain run` refuses it elsewhere")
    elif launch.device != "cuda":
        report.error("fp8", "needs a GPU of compute capability 8.9 or later; this run's ranks would use the CPU")
    elif launch.capability is not None and tuple(launch.capability) < MIN_CAPABILITY:
        major, minor = launch.capability
        report.error(
            "fp8",
            f"needs a GPU of compute capability 8.9 or later (float8 tensor cores); this one is {major}.{minor}; "
            "remove fp8",
        )


@hookimpl
def ktrain_validate_config(config: Any, report: Any, launch: Any) -> None:
    """The device, the keys that cannot work beside fp8, and the fp8 keys set without it."""
    if not config.fp8:
        for name in ("fp8_recipe", "fp8_amax_history_len", "fp8_fast_accumulation", "fp8_fused_mlp",
                     "fp8_exclude_modules", "fp8_skip_small_layers", "fp8_enable_fsdp_float8_all_gather"):  # fmt: skip
            if config.is_set(name):
                report.warn(name, "has no effect without fp8: true")
        return
    _check_device(config, report, launch)
    if config.fp8_amax_history_len < 1:
        report.error("fp8_amax_history_len", f"must be at least 1, not {config.fp8_amax_history_len}")
    for name in ("fp8_amax_history_len", "fp8_fused_mlp"):
        if config.is_set(name) and config.fp8_recipe != "delayed":
            report.warn(name, f"has no effect with fp8_recipe: {config.fp8_recipe} (only with delayed)")
    for name, reason in REFUSED_WITH.items():
        if getattr(config, name, None) not in (None, False, 1, ""):
            report.error("fp8", f"cannot be used with {name}: {reason}; remove fp8 or {name}")
    version = fsdp_version(config)
    if version == 1:
        report.error("fp8", "cannot be used with FSDP1 (fsdp_version: 1 or unset); set fsdp_version: 2 or remove fp8")
    if getattr(config, "fp16", False):
        report.error("fp8", "computes beside bf16, not fp16; set bf16: true instead of fp16, or remove fp8")
    for name in FUSED_OUTPUT:
        if getattr(config, name, False) and not excluded("lm_head", config.fp8_exclude_modules):
            report.error(
                "fp8_exclude_modules",
                f"must keep lm_head in bf16 with {name}, which multiplies the output layer's weight itself; "
                f"add lm_head or remove {name}" + FLOAT8_HEAD.get(name, ""),
            )
    if config.fp8_enable_fsdp_float8_all_gather:
        if version != 2:
            report.error(
                "fp8_enable_fsdp_float8_all_gather", "gathers FSDP2's shards; set fsdp_version: 2 or remove it"
            )
        if config.fp8_recipe != "tensorwise":
            report.error(
                "fp8_enable_fsdp_float8_all_gather",
                f"works with fp8_recipe: tensorwise only (torchao), not {config.fp8_recipe}; remove one of the two",
            )
    if not getattr(config, "torch_compile", False):
        report.warn(
            "fp8", "without torch_compile the casts to float8 run as separate eager kernels; add torch_compile: true"
        )


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Convert the linear layers on each rank when ``fp8`` is true."""
    if not config.fp8:
        return
    activate("ktrain_fp8.runtime:Fp8Training", keys=("fp8",))


@hookimpl
def ktrain_collect_memory(config: Any, model_shape: Any) -> dict[str, Any] | None:
    """The float8 layers' part of one rank's memory model (``ktrain_fp8.memory``): inputs kept in float8."""
    from ktrain_fp8.memory import collect_memory

    return collect_memory(config, model_shape)
