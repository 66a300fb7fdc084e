"""The config keys of ktrain-plugin-compile: Axolotl's ``torch_compile`` keys (no torch here)."""

from __future__ import annotations

from typing import Any

import attrs

from ktrain.config.fast_defaults import GpuDefault
from ktrain.config.keys import key

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""The modes of torch.compile that ``torch_compile_mode`` accepts."""

PARALLEL_SIZES = ("tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree")
"""Mesh sizes (the kernel's two, the parallel plugin's Ulysses degree) under which compiled blocks are refused:
with tensor_parallel_size 2 the compiled blocks' gradients differed from eager ones (docs: plugins/compile)."""


LIGER_BLOCK_KEYS = ("liger_rope", "liger_rms_norm", "liger_glu_activation", "liger_swiglu")
"""ktrain-plugin-liger's keys of kernels inside the blocks: rope, RMSNorm and the SwiGLU activation."""


def _compile_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why compiled blocks are not the fast default of ``config`` (None: they are).

    Not over a quantized base (bitsandbytes' 4-bit and 8-bit layers are not compiled), nor where the config
    writes Liger's kernels for the blocks (rope, RMSNorm, SwiGLU): those fuse the same pointwise work, and
    compiling the blocks around them was slower. On one H200 on 2026-12-04 the 1.5B Llama shape with Liger's
    three kernels, FSDP2 and activation checkpointing (configs/bench/llama_1p5b_fsdp2_liger_ac.yaml) trained
    46,497 tokens/s with compiled blocks and 50,140 without, at the same peak memory
    (docs/results/h200-2026-12-04-plan3).
    """
    if any(getattr(config, name, None) not in (None, 1) for name in PARALLEL_SIZES):
        return "a parallel size other than 1"
    if any(config.is_set(name) and getattr(config, name, False) for name in LIGER_BLOCK_KEYS):
        return "Liger's kernels are asked for in the blocks"
    if getattr(config, "load_in_4bit", False) or getattr(config, "load_in_8bit", False):
        return "a quantized base"
    if getattr(config, "adapter", None) == "qlora" or getattr(config, "qlora", False):
        return "a quantized base"
    return None


@attrs.define(kw_only=True)
class CompileKeys:
    """torch.compile of each transformer block: pointwise work fused into fewer kernels."""

    torch_compile: bool = key(
        False,
        "compile each transformer block's forward with torch.compile (the blocks' hooks stay eager)",
        gpu_default=GpuDefault(
            True,
            "the blocks' pointwise work fused into fewer kernels: the same computation, rounded differently",
            unless=_compile_unless,
        ),
    )
    torch_compile_backend: str = key("inductor", "torch.compile's backend (torch._dynamo.list_backends())")
    torch_compile_mode: str | None = key(None, f"torch.compile's mode: one of {', '.join(MODES)}")
