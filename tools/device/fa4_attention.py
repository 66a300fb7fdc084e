"""FlashAttention-4 (the flash-attn-4 package, CuTe DSL) beside cuDNN's SDPA and FlexAttention, on CUDA.

    python tools/device/fa4_attention.py [--repeat 20]

Forward + backward, bf16, 32 query heads over 8 KV heads of dimension 64, on two shapes of configs/bench:

- the 1.5B Llama's causal rows, 4 x 4096 (``llama_1p5b``): SDPA's cuDNN kernel (q/k/v handed over as a
  transformers attention layer hands them: transposed views of ``[batch, length, heads, dim]``), FA4's
  ``flash_attn_func``, which takes that layout itself, and SDPA's flash backend with FA4's kernels in its place
  (``ktrain_flash_attention.kernels.register``, what ``flash_attention_4: true`` does on a rank);
- DPO's shared rows, 4 pairs of 512 + 512 + 512 (``llama_1p5b_dpo``, ``--pairs 512:512``): FlexAttention with
  the rows' ``BlockMask``, as ktrain runs it; the same with ``kernel_options={"BACKEND": "FLASH"}`` (PyTorch's
  FlexAttention on FA4's CuTe DSL kernels, where the installed torch has that backend and flash-attn-4 is
  there); and FA4's ``flash_attn_varlen_func`` over two sequences a row:
  the prompt and chosen answer (causal), and the rejected answer's queries over the prompt's and its own keys
  (causal from the bottom right, FlashAttention's convention where a sequence has fewer queries than keys).

Each line gives the milliseconds of a forward and backward (CUDA events, after 3 unmeasured calls, which
compile FA4's kernels), the milliseconds of its kernels alone (the profiler's device time: where a way's host
launches its kernels more slowly than the device runs them, the first figure is the host's; in a training step
other layers' work fills that time), TFLOP/s over the allowed (query, key) pairs, and the largest difference of
the outputs from fp32 SDPA (the dense shape: from cuDNN's bf16 output).
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from flash_attn.cute.interface import flash_attn_func, flash_attn_varlen_func
from ktrain_flash_attention.kernels import register
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import flex_attention

from ktrain.data.batches import document_mask

HEADS, KV_HEADS, DIM = 32, 8, 64
PROMPT, CHOSEN, REJECTED = 1, 2, 3  # ktrain_preference.layout's segments


def leaf(batch: int, length: int, heads: int) -> torch.Tensor:
    return torch.randn((batch, length, heads, DIM), device="cuda", dtype=torch.bfloat16, requires_grad=True)


def first(out: object) -> torch.Tensor:
    return out[0] if isinstance(out, tuple) else out  # type: ignore[index,return-value]


def report(name: str, forward: Callable[[], torch.Tensor], expected: torch.Tensor, pairs: int, repeat: int) -> None:
    try:
        out = forward()
        grad = torch.randn_like(out)
        error = (out.float() - expected.float()).abs().max().item()
        for _ in range(3):
            forward().backward(grad)
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeat):
            forward().backward(grad)
        end.record()
        torch.cuda.synchronize()
        ms = start.elapsed_time(end) / repeat
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as profile:
            for _ in range(repeat):
                forward().backward(grad)
            torch.cuda.synchronize()
        on_device = [e.time_range.elapsed_us() for e in profile.events() if e.device_type.name == "CUDA"]
        kernels = sum(on_device) / 1e3 / repeat
        flops = 4 * HEADS * pairs * DIM * 3.5
        print(f"  {name:36s} {ms:7.3f} ms ({kernels:6.3f} ms of kernels)  {flops / ms / 1e9:5.0f} TFLOP/s  "
              f"largest difference {error:.2e}", flush=True)  # fmt: skip
    except Exception as e:  # a way that cannot run says why, and the others still run
        print(f"  {name:36s} cannot: {type(e).__name__}: {str(e).splitlines()[0][:140]}", flush=True)


def dense(repeat: int) -> None:
    batch, length = 4, 4096
    q, k, v = leaf(batch, length, HEADS), leaf(batch, length, KV_HEADS), leaf(batch, length, KV_HEADS)

    def sdpa(backend: SDPBackend) -> torch.Tensor:
        with sdpa_kernel([backend]):
            out = F.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True, enable_gqa=True
            )
        return out.transpose(1, 2).contiguous()

    expected = sdpa(SDPBackend.CUDNN_ATTENTION).detach()
    pairs = batch * length * (length + 1) // 2
    print(f"causal rows, {batch} x {length}: {pairs:,} (query, key) pairs")
    report("SDPA, cuDNN", lambda: sdpa(SDPBackend.CUDNN_ATTENTION), expected, pairs, repeat)
    report("FA4 flash_attn_func", lambda: first(flash_attn_func(q, k, v, causal=True)), expected, pairs, repeat)
    library = register()  # SDPA's flash kernels replaced by FA4's, as ktrain-plugin-flash-attention does
    report("SDPA, flash backend: FA4", lambda: sdpa(SDPBackend.FLASH_ATTENTION), expected, pairs, repeat)
    del library


def shared(repeat: int) -> None:
    rows, prompt, answer = 4, 512, 512
    length = prompt + 2 * answer
    segments = torch.tensor([PROMPT] * prompt + [CHOSEN] * answer + [REJECTED] * answer, device="cuda")
    segments = segments.expand(rows, -1)
    q, k, v = leaf(rows, length, HEADS), leaf(rows, length, KV_HEADS), leaf(rows, length, KV_HEADS)
    blocks = document_mask(segments, "flex_attention", prefix=PROMPT)
    boolean = document_mask(segments, "sdpa", prefix=PROMPT)
    wide = [t.detach().float().transpose(1, 2) for t in (q, k, v)]
    expected = F.scaled_dot_product_attention(*wide, attn_mask=boolean, enable_gqa=True).transpose(1, 2)
    flex = torch.compile(flex_attention)

    def flex_way(options: dict | None = None) -> torch.Tensor:
        out = flex(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=blocks, enable_gqa=True,
            kernel_options=options,
        )  # fmt: skip
        return out.transpose(1, 2).contiguous()

    # a row's keys: prompt + chosen, then prompt + rejected
    per_row = torch.cat([torch.arange(prompt + answer), torch.arange(prompt), torch.arange(prompt + answer, length)])
    keys = (torch.arange(rows)[:, None] * length + per_row).flatten().cuda()
    query_ends = torch.tensor([0] + [r * length + e for r in range(rows) for e in (prompt + answer, length)])
    key_ends = torch.arange(2 * rows + 1) * (prompt + answer)
    cu_q, cu_k = query_ends.to("cuda", torch.int32), key_ends.to("cuda", torch.int32)

    def fa4_varlen() -> torch.Tensor:
        out = flash_attn_varlen_func(
            q.view(-1, HEADS, DIM), k.view(-1, KV_HEADS, DIM)[keys], v.view(-1, KV_HEADS, DIM)[keys],
            cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=prompt + answer, max_seqlen_k=prompt + answer,
            softmax_scale=1 / math.sqrt(DIM), causal=True,
        )  # fmt: skip
        return first(out).view(rows, length, HEADS, DIM)

    pairs = rows * (prompt * (prompt + 1) // 2 + 2 * (answer * prompt + answer * (answer + 1) // 2))
    print(f"shared rows, {rows} x ({prompt} + {answer} + {answer}): {pairs:,} (query, key) pairs")
    report("FlexAttention, BlockMask", flex_way, expected, pairs, repeat)
    flash = {"BACKEND": "FLASH"}  # inductor's CuTe DSL templates: FA4's kernels with the block mask's mask_mod
    report("FlexAttention, BlockMask, BACKEND=FLASH", lambda: flex_way(flash), expected, pairs, repeat)
    report("FA4 flash_attn_varlen_func, 2 a row", fa4_varlen, expected, pairs, repeat)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=20)
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    dense(args.repeat)
    shared(args.repeat)


if __name__ == "__main__":
    main()
