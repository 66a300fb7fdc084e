"""What this machine's DeepSpeed can run, checked before any rank starts: 16-bit types and NVMe offload.

DeepSpeed's CPU accelerator (``DS_ACCELERATOR=cpu``, used where there is no GPU) computes in bf16 but in
fp16 only on CPUs whose oneDNN supports it; NVMe offload needs DeepSpeed's ``async_io`` op, built against
libaio. Without these DeepSpeed stops on every rank after start-up; here the run stops first, saying so.
"""

from __future__ import annotations

from typing import Any

from ktrain_deepspeed import links
from ktrain_deepspeed.accelerator import load_deepspeed


def problems(settings: dict[str, Any]) -> list[tuple[str, str]]:
    """``(json path, message)`` for what ``settings`` (with "auto" filled) asks and this machine cannot do."""
    load_deepspeed()
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    name = accelerator.device_name()
    out = []
    for dtype, supported in (("bf16", accelerator.is_bf16_supported()), ("fp16", accelerator.is_fp16_supported())):
        if links.get(settings, f"{dtype}.enabled") is True and not supported:
            out.append(
                (f"{dtype}.enabled", f"DeepSpeed's {name} accelerator cannot compute in {dtype} on this machine; "
                 f"set {dtype}: false{' (bf16: true trains in 16 bits)' if dtype == 'fp16' else ''}")
            )  # fmt: skip
    for section in ("offload_param", "offload_optimizer"):
        if links.get(settings, f"zero_optimization.{section}.device") == "nvme":
            builder = accelerator.create_op_builder("AsyncIOBuilder")
            if builder is None or not builder.is_compatible(verbose=False):
                out.append(
                    (f"zero_optimization.{section}.device", "nvme needs DeepSpeed's async_io op, which needs libaio "
                     "(apt-get install libaio-dev) and a C++ compiler; install them, or offload to cpu")
                )  # fmt: skip
    return out
