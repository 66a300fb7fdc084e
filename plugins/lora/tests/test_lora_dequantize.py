"""The one-kernel dequantization of a 4-bit weight (``ktrain_lora.dequantize_triton``) against bitsandbytes'.

On the CPU the kernel runs in Triton's interpreter (``TRITON_INTERPRET=1``, a fresh process) in fp32 (the
interpreter truncates where it rounds to bf16) against bitsandbytes' definition written out in torch; on a
GPU (marked) against bitsandbytes' own CUDA ``dequantize_4bit``, to the bit, in fp32, bf16 and fp16.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

CASES = [(nested, shape) for nested in (True, False) for shape in ((128, 96), (64, 200), (3, 320), (300, 64 * 9))]


def test_the_kernel_in_triton_s_interpreter_equals_bitsandbytes_definition() -> None:
    pytest.importorskip("triton")
    script = f"""
import torch
import bitsandbytes.functional as F
from ktrain_lora.dequantize_triton import dequantize

def reference(packed, state):
    if state.nested:  # the 8-bit scales: code2[q] * absmax2[block // blocksize2], then the offset
        scales = state.state2.code[state.absmax.long()]
        blocks = torch.arange(state.absmax.numel()) // state.state2.blocksize
        absmax = scales * state.state2.absmax[blocks] + state.offset
    else:
        absmax = state.absmax
    data = packed.view(torch.uint8).reshape(-1).long()
    values = torch.stack([state.code[data >> 4], state.code[data & 15]], 1).reshape(-1)
    return (values.view(-1, state.blocksize) * absmax.view(-1, 1)).reshape(state.shape).to(state.dtype)

torch.manual_seed(0)
for nested, shape in {CASES!r}:
    weight = torch.randn(shape) * 0.05
    packed, state = F.quantize_4bit(
        weight, blocksize=64, compress_statistics=nested, quant_type="nf4", quant_storage=torch.bfloat16
    )
    state.dtype = torch.float32
    got, expected = dequantize(packed, state), reference(packed, state)
    assert got.dtype == torch.float32 and got.shape == shape, (got.dtype, got.shape)
    assert torch.equal(got, expected), (nested, shape, (got - expected).abs().max())
    assert (got - weight).norm() < 0.12 * weight.norm(), (nested, shape)  # NF4's rounding: about 9%
print("ok")
"""
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_the_kernel_on_a_gpu_equals_bitsandbytes_cuda_dequantization(dtype: torch.dtype) -> None:
    import bitsandbytes.functional as F

    from ktrain_lora.dequantize_triton import dequantize

    torch.manual_seed(0)
    for nested, shape in [*CASES, (True, (14336, 4096))]:
        weight = torch.randn(shape, device="cuda") * 0.05
        packed, state = F.quantize_4bit(
            weight.to(dtype), blocksize=64, compress_statistics=nested, quant_type="nf4", quant_storage=torch.bfloat16
        )
        got, expected = dequantize(packed, state), F.dequantize_4bit(packed, state)
        assert got.dtype == expected.dtype == dtype
        assert torch.equal(got, expected), (nested, shape)


@pytest.mark.parametrize("out", ["*bf16", "*fp16", "*fp32"])
def test_the_kernel_compiles_for_a_hopper_gpu_without_fused_multiply_adds(out: str) -> None:
    """Triton compiles the kernel to PTX for sm_90 without a GPU: no fused multiply-add (the scale's product and
    its offset round apart, as in bitsandbytes), and bf16 values rounded to nearest."""
    triton = pytest.importorskip("triton")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from ktrain_lora.dequantize_triton import _dequantize_kernel

    for nested in (True, False):
        pointers = ("packed", "code", "absmax", "absmax8", "absmax2", "code2", "offset")
        signature = {name: "*fp32" for name in pointers} | {"packed": "*u8", "out": out}
        signature |= {"absmax8": "*u8"} if nested else {}
        signature |= {"n_bytes": "i32", "n_values": "i32"}
        constants = {"BLOCKSIZE": 64, "BLOCKSIZE2": 256, "NESTED": nested, "BYTES": 1024}
        source = ASTSource(_dequantize_kernel, signature | dict.fromkeys(constants, "constexpr"), constexprs=constants)
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"enable_fp_fusion": False}).asm["ptx"]
        assert "fma." not in ptx, nested
        assert ("cvt.rn.bf16" in ptx) == (out == "*bf16"), nested
