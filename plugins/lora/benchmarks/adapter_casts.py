"""The kernels inductor generates for compiled LoRA blocks, fp32 adapter weights under bf16 autocast against bf16
adapter weights (what ``adamw_fp32_master`` trains, its fp32 masters in the optimizer): the casts of the adapter's
weights in the forward and of their gradients in the backward are kernels of their own, launched every step.

A two-block Llama (hidden 256, 8 heads, 2 KV heads), bf16 base, LoRA r 16 on every linear layer, each block's
forward compiled as ktrain-plugin-compile compiles it; one forward and backward under bf16 autocast on this
machine's CPU, and the generated code of every graph (forwards and backwards) read for its fused kernels and its
calls of extern kernels (the matrix multiplies). On a GPU inductor generates Triton kernels from the same graphs.

    python plugins/lora/benchmarks/adapter_casts.py
"""

from __future__ import annotations

import re

import peft
import torch
import transformers
from torch._inductor.utils import run_and_get_code

FUSED = re.compile(r"^\s+(cpp_fused_\w+|triton_\w+)(\.run)?\(", re.MULTILINE)
EXTERN = re.compile(r"^\s+(\w+ = )?extern_kernels\.\w+\(", re.MULTILINE)


def _counts(adapter_dtype: torch.dtype) -> tuple[int, int]:
    """Fused and extern kernel calls in the code generated for one step with adapter weights in ``adapter_dtype``."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        hidden_size=256,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=32,
        vocab_size=512,
    )
    model = transformers.LlamaForCausalLM(config).to(torch.bfloat16)
    model = peft.get_peft_model(model, peft.LoraConfig(r=16, lora_alpha=32, target_modules="all-linear"))
    for param in model.parameters():
        if param.requires_grad:
            param.data = param.data.to(adapter_dtype)
    for block in model.base_model.model.model.layers:
        block.forward = torch.compile(block.forward)
    ids = torch.randint(0, config.vocab_size, (2, 64))

    def step() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=ids, labels=ids).loss
        loss.backward()

    _, codes = run_and_get_code(step)
    code = "\n".join(codes)
    return len(FUSED.findall(code)), len(EXTERN.findall(code))


def main() -> None:
    for name, dtype in (("fp32 adapter weights", torch.float32), ("bf16 adapter weights", torch.bfloat16)):
        fused, extern = _counts(dtype)
        print(f"{name}: {fused} fused kernels, {extern} extern kernels (matrix multiplies) in the generated code")


if __name__ == "__main__":
    main()
