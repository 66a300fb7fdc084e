"""On a GPU of compute capability 9.x or 10.x with flash-attn-4: SDPA runs FlashAttention-4's kernels, as
exactly as cuDNN's, and so does FlexAttention's FLASH backend with a block mask, as exactly as its Triton
kernels (skipped elsewhere).

Causal, bf16, 32 query heads over 8 KV heads of dimension 64, q/k/v as a transformers attention layer hands them
(transposed views of ``[batch, length, heads, dim]``); SDPA choosing its backend itself after the rank's
``prefer_flash``, eager and inside ``torch.compile``, whose graph calls the flash operators; the profiler shows no
kernel of PyTorch's FlashAttention-2 or of cuDNN. Both kernels round in bf16, in different orders: on an H100
their outputs differed by up to 0.031 (two bf16 steps at magnitude 2,
docs/results/h100-2026-12-06-fa4/gpu_tests_tolerance_failure.txt). So each is compared with the attention in fp32
(the same bf16 inputs): FlashAttention-4's largest error in the output and in each gradient is at most twice
cuDNN's, plus 1e-3.
"""

from __future__ import annotations

import contextlib
import importlib.util

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel


def _capable() -> bool:
    return (
        torch.cuda.is_available()
        and torch.cuda.get_device_capability()[0] in (9, 10)
        and importlib.util.find_spec("flash_attn") is not None
    )


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return out.transpose(1, 2).contiguous()


@pytest.mark.gpu
@pytest.mark.skipif(not _capable(), reason="needs a GPU of compute capability 9.x or 10.x and flash-attn-4")
def test_sdpa_runs_flash_attention_4_and_gives_cudnns_values_and_gradients() -> None:
    from ktrain_flash_attention.kernels import register
    from ktrain_flash_attention.runtime import prefer_flash

    torch.manual_seed(0)
    leaves = [
        torch.randn((2, 1024, heads, 64), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for heads in (32, 8, 8)
    ]
    grad = torch.randn((2, 1024, 32, 64), device="cuda", dtype=torch.bfloat16)

    def run(backend: SDPBackend | None, compiled: bool, wide: bool = False) -> list[torch.Tensor]:
        q, k, v = ((t.float() if wide else t).transpose(1, 2) for t in leaves)
        attend = torch.compile(_attend) if compiled else _attend
        with sdpa_kernel([backend]) if backend is not None else contextlib.nullcontext():
            out = attend(q, k, v)
        out.backward(grad.float() if wide else grad)
        found = [out.detach().float(), *(t.grad.float() for t in leaves)]
        for t in leaves:
            t.grad = None
        return found

    exact = run(SDPBackend.MATH, False, wide=True)
    cudnn_found = run(SDPBackend.CUDNN_ATTENTION, False)
    cudnn = [(got - want).abs().max().item() for got, want in zip(cudnn_found, exact, strict=True)]
    order, cudnn_on = torch._C._get_sdp_priority_order(), torch.backends.cuda.cudnn_sdp_enabled()
    library = register()
    prefer_flash(torch.device("cuda"))  # what a rank does: SDPA's own choice, no backend named, from here on
    try:
        for compiled in (False, True):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
                found = run(None, compiled)
            names = {event.name for event in profile.events() if event.device_type.name == "CUDA"}
            # neither PyTorch's FlashAttention-2 nor cuDNN's attention
            assert not any("pytorch_flash" in name or "cudnn" in name for name in names), names
            for got, want, limit in zip(found, exact, cudnn, strict=True):
                assert (got - want).abs().max().item() <= 2 * limit + 1e-3, (compiled, limit)
    finally:
        del library
        torch._C._set_sdp_priority_order(order)
        torch.backends.cuda.enable_cudnn_sdp(cudnn_on)


@pytest.mark.gpu
@pytest.mark.skipif(not _capable(), reason="needs a GPU of compute capability 9.x or 10.x and flash-attn-4")
def test_flexattentions_flash_backend_keeps_the_block_mask_and_its_accuracy() -> None:
    """DPO's shared rows (a prompt, then two answers that each see the prompt and themselves, as
    ``ktrain_preference.layout`` builds them) through transformers' FlexAttention function as a model layer calls
    it, with and without the plugin's FLASH backend: within twice the Triton backend's largest error against fp32
    attention with the same mask, plus 1e-3, in the output and each gradient."""
    from transformers import AttentionInterface
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    from ktrain.data.batches import document_mask
    from ktrain_flash_attention.flex import use_flash_backend

    torch.manual_seed(0)
    prompt, chosen, rejected = 1, 2, 3
    segments = torch.tensor([prompt] * 256 + [chosen] * 256 + [rejected] * 256, device="cuda").expand(2, -1)
    blocks = document_mask(segments, "flex_attention", prefix=prompt)
    boolean = document_mask(segments, "sdpa", prefix=prompt)
    leaves = [
        torch.randn((2, heads, 768, 64), device="cuda", dtype=torch.bfloat16, requires_grad=True)
        for heads in (32, 8, 8)
    ]
    grad = torch.randn((2, 768, 32, 64), device="cuda", dtype=torch.bfloat16)
    layer = torch.nn.Module()  # what transformers reads of the attention module: its training flag

    def run(attend: object | None) -> list[torch.Tensor]:
        if attend is None:  # fp32, the boolean mask
            wide = [t.float() for t in leaves]
            out = F.scaled_dot_product_attention(*wide, attn_mask=boolean, enable_gqa=True).transpose(1, 2)
        else:
            # compiled as a block is, the log-sum-exp a layer drops stays inside the graph (no gradient of its own)
            out = torch.compile(lambda *qkv: attend(layer, *qkv, blocks, scaling=64**-0.5)[0])(*leaves)
        out.backward(grad.float() if attend is None else grad)
        found = [out.detach().float(), *(t.grad.float() for t in leaves)]
        for t in leaves:
            t.grad = None
        return found

    original = ALL_ATTENTION_FUNCTIONS["flex_attention"]
    exact = run(None)
    triton = [(got - want).abs().max().item() for got, want in zip(run(original), exact, strict=True)]
    try:
        use_flash_backend()
        flash = run(ALL_ATTENTION_FUNCTIONS["flex_attention"])
    finally:
        AttentionInterface.register("flex_attention", original)
    for got, want, limit in zip(flash, exact, triton, strict=True):
        assert (got - want).abs().max().item() <= 2 * limit + 1e-3, limit
