"""What compiled blocks save for backward: the plugin's answer to ``ktrain_collect_memory``. No torch here.

Inductor compiles each block's forward and backward together and, by its min-cut partition, saves the
matrix products' inputs and outputs and recomputes the cheap pointwise work in backward: the RMSNorms'
normalized outputs, the rotary embedding's rotated halves and SiLU(gate) are not kept, as under Liger's
fused RMSNorm, rope and SwiGLU. On one H200 the 1.5B Llama shape of configs/bench held 39.4 GiB with
compiled blocks and 39.3 GiB with Liger's three ops instead, the rest of the run the same (docs/results,
h200-2026-12-03d: compile_call2.json and liger_master_call2.json).
"""

from __future__ import annotations

from typing import Any

FUSED = frozenset({"rms_norm", "rope", "swiglu"})
"""The ops, in the memory model's names, whose saved tensors compiled blocks leave out."""


def collect_memory(config: Any) -> dict[str, Any] | None:
    """The ``"compiled"`` ops when ``torch_compile`` compiles the blocks."""
    return {"compiled": FUSED} if config.torch_compile else None
