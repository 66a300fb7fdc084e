"""The config keys of ktrain-plugin-compile: Axolotl's ``torch_compile`` keys (no torch here)."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key

MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")
"""The modes of torch.compile that ``torch_compile_mode`` accepts."""


@attrs.define(kw_only=True)
class CompileKeys:
    """torch.compile of each transformer block: pointwise work fused into fewer kernels."""

    torch_compile: bool = key(
        False, "compile each transformer block's forward with torch.compile (the blocks' hooks stay eager)"
    )
    torch_compile_backend: str = key("inductor", "torch.compile's backend (torch._dynamo.list_backends())")
    torch_compile_mode: str | None = key(None, f"torch.compile's mode: one of {', '.join(MODES)}")
