"""Entry module of ktrain-plugin-fused-loss: the ``fused_linear_cross_entropy`` keys, and the role of that op.

Imports nothing heavy: torch (and Triton) are imported by the runtime object, activated only when
``fused_linear_cross_entropy`` is true. The op is the role ``op:fused_linear_cross_entropy``, which
``liger_fused_linear_cross_entropy`` claims too: asking for both stops the run before it starts.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain_fused_loss.keys import FLOAT8_CAPABILITY, PARALLEL_SIZES, FusedLossKeys


@hookimpl
def ktrain_register_config(register) -> None:
    """Declare ``fused_linear_cross_entropy``, ``fused_linear_cross_entropy_chunks`` and
    ``fused_linear_cross_entropy_fp8``."""
    register(FusedLossKeys)


def _check_float8(config: Any, report: Any, launch: Any) -> None:
    """``fused_linear_cross_entropy_fp8``: set with the op, in one chunk, on a GPU with float8 tensor cores."""
    name = "fused_linear_cross_entropy_fp8"
    if not config.fused_linear_cross_entropy:
        report.error(name, "runs inside fused_linear_cross_entropy; set that key too, or remove this one")
    elif config.fused_linear_cross_entropy_chunks != 1:
        report.error(
            name,
            "holds the logits' gradient in float8 until the backward; set fused_linear_cross_entropy_chunks: 1 "
            "or remove this key",
        )
    if launch is not None and launch.device == "cpu":
        report.warn(name, "on a CPU torch emulates the float8 products: slower than without it, for checking only")
    elif launch is not None and launch.capability is not None and tuple(launch.capability) < FLOAT8_CAPABILITY:
        major, minor = launch.capability
        report.error(
            name, f"needs a GPU of compute capability 8.9 or later (float8 tensor cores); this one is {major}.{minor}"
        )


@hookimpl
def ktrain_validate_config(config: Any, report: Any, launch: Any) -> None:
    """A chunk count below 1, or set without the op; the op under tensor, context or sequence parallelism; float8
    products without the op, in chunks, or on a GPU without float8 tensor cores."""
    chunks = config.fused_linear_cross_entropy_chunks
    if chunks < 1:
        report.error("fused_linear_cross_entropy_chunks", "must be a whole number of at least 1")
    elif config.is_set("fused_linear_cross_entropy_chunks") and not config.fused_linear_cross_entropy:
        report.error("fused_linear_cross_entropy_chunks", "sizes fused_linear_cross_entropy's chunks; set that key too")
    if config.fused_linear_cross_entropy:
        for name in PARALLEL_SIZES:
            if getattr(config, name, None) not in (None, 1):
                report.error(
                    "fused_linear_cross_entropy",
                    f"is not supported with {name} other than 1 yet; remove fused_linear_cross_entropy or the "
                    "parallel size",
                )
    if config.fused_linear_cross_entropy_fp8:
        _check_float8(config, report, launch)


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Replace the output layer and the loss, claiming ``op:fused_linear_cross_entropy``."""
    if not config.fused_linear_cross_entropy:
        return
    activate(
        "ktrain_fused_loss.runtime:FusedLoss",
        roles=("op:fused_linear_cross_entropy",),
        keys=("fused_linear_cross_entropy",),
    )


@hookimpl
def ktrain_collect_memory(config: Any) -> dict[str, Any] | None:
    """In one rank's memory model: in chunks no whole-sequence logits are held; in one chunk the logits'
    gradient, in the compute dtype (2 bytes a logit under bf16 or fp16, else 4), is held until the backward;
    with float8 products, two float8 copies of it (2 bytes a logit)."""
    if not config.fused_linear_cross_entropy:
        return None
    if config.fused_linear_cross_entropy_chunks > 1:
        return {"loss": "fused"}
    if config.fused_linear_cross_entropy_fp8:
        return {"loss": 2}
    return {"loss": 2 if (config.bf16 or config.bfloat16 or config.fp16) else 4}
