"""The memory traffic of one compiled block's forward + backward on the 1.5B shape, as inductor plans it, on a CPU.

Inductor writes Triton kernels for a GPU; with ``cpu_backend = "triton"`` it writes the same kind of kernels for a
CPU tensor, and with ``benchmark_kernel`` each kernel carries inductor's count of the bytes it reads and writes
(``kernel_num_gb``), which this script reads from each kernel's source as inductor hands it over. It compiles one
block of configs/bench/llama_1p5b (hidden 2048, intermediate 8192, 32 heads, 8 KV heads) for ``--tokens`` tokens
(16,384: the bench's 4 x 4096), converted as the plugin converts it, with the backward lowered at once, and it
prints each generated kernel's gigabytes and their sum. Triton is only asked for code: the kernels are not
compiled or run, so no GPU is needed. The float8 products and the attention are not inductor's kernels and are
not counted.

- ``bf16``: nothing converted; ``tensorwise``: torchao's layers; ``delayed``: the plugin's delayed-scaling
  layers, each apart; ``fused``: delayed with ``fp8_fused_mlp``. The fused MLP's backward pass is a Triton
  kernel of its own, opaque to inductor: its bytes are counted from the tensors it reads and writes and printed
  on a line of their own.

The scales count as calibrated (the steady state after the first micro-step). Bytes are not time: on an H200 the
tensorwise step's scaling passes took 31.6 ms for about 78 GB more than bf16's over the 16 blocks (2.5 TB/s), and on
an H100 the fused MLP's 42 GB less took about 5 ms off (docs/performance.md), the step being held at the power limit.

    python plugins/fp8/benchmarks/block_traffic.py --recipe fused [--tokens 16384]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import types
from pathlib import Path

import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
import transformers
from torch._inductor.async_compile import AsyncCompile

import ktrain_fp8.swiglu as swiglu
from ktrain_fp8.runtime import convert

SHAPE = Path(__file__).resolve().parents[3] / "configs/bench/llama_1p5b"
GIGABYTES = re.compile(r"'kernel_num_gb': ([0-9.e-]+)")


@torch.library.custom_op("ktrain_fp8_bench::swiglu_backward", mutates_args=())
def _opaque_swiglu_backward(
    grad_h: torch.Tensor, gate: torch.Tensor, up: torch.Tensor, scales: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The fused MLP's backward pass as one call inductor does not look into, as the Triton op is."""
    return swiglu.swiglu_backward_float8_reference(grad_h, gate, up, scales)


OPAQUE_GB: list[float] = []
"""The bytes the opaque pass reads and writes, each time it is traced."""


@_opaque_swiglu_backward.register_fake
def _(grad_h, gate, up, scales):
    outputs = tuple(t.clone() for t in swiglu.swiglu_backward_float8_reference(grad_h, gate, up, scales))
    OPAQUE_GB.append(sum(t.numel() * t.element_size() for t in (grad_h, gate, up, *outputs)) / 1e9)
    return outputs


def _keys(recipe: str) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        fp8_recipe="delayed" if recipe == "fused" else recipe,
        fp8_fused_mlp=recipe == "fused",
        fp8_amax_history_len=16,
        fp8_fast_accumulation=False,
        fp8_exclude_modules=["lm_head"],
        fp8_skip_small_layers=True,
        fp8_enable_fsdp_float8_all_gather=False,
        source="block_traffic",
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--recipe", choices=("bf16", "tensorwise", "delayed", "fused"), default="fused")
    parser.add_argument("--tokens", type=int, default=16384)
    args = parser.parse_args()

    inductor_config.cpu_backend = "triton"
    inductor_config.benchmark_kernel = True
    inductor_config.compile_threads = 1
    functorch_config.force_non_lazy_backward_lowering = True
    torch.utils._triton.triton_hash_with_backend = lambda: "code only"
    kernels: list[tuple[str, float]] = []

    def written(self, kernel_name: str, source_code: str, device_str: str = "cuda") -> None:
        kernels.append((kernel_name, float(GIGABYTES.search(source_code).group(1))))

    AsyncCompile.triton = written

    swiglu._swiglu_backward_float8 = _opaque_swiglu_backward
    config = transformers.AutoConfig.from_pretrained(SHAPE, num_hidden_layers=1, vocab_size=128)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).to(torch.bfloat16)
    if args.recipe != "bf16":
        scales = convert(model, _keys(args.recipe))
        if scales is not None:
            scales.calibrated = True
    block = model.model.layers[0]
    block.forward = torch.compile(block.forward)
    ids = torch.randint(0, 128, (1, args.tokens))
    with contextlib.suppress(AttributeError):  # the first kernel launched: there is none, only its code
        model(input_ids=ids, labels=ids).loss.backward()
    for name, gigabytes in kernels:
        print(f"{gigabytes:8.4f} GB  {name}")
    total = sum(g for _, g in kernels)
    print(f"{args.recipe}: {len(kernels)} inductor kernels, {total:.3f} GB", end="")
    if args.recipe == "fused":
        print(f"; the fused MLP's backward pass (counted from its tensors; not run): {OPAQUE_GB[-1]:.3f} GB", end="")
        total += OPAQUE_GB[-1]
    print(f"; {total:.3f} GB a block's forward + backward at {args.tokens} tokens")


if __name__ == "__main__":
    main()
