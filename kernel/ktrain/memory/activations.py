"""Activation memory of one rank: what each transformer block saves for backward, and the logits.

Counted per token of a block, from the ops a Llama block runs (SDPA attention, which keeps no
sequence-by-sequence scores; ``transformers``' eager RMSNorm, rotary embedding and SiLU-times-up):

- the residual stream at the block's input and between attention and MLP, in the weights' dtype
  (fp32 under autocast with fp32 weights);
- each norm's normalized output (weights' dtype) and the inputs of the projections, cast to the
  compute dtype: the norm output for q/k/v and for gate/up, the attention output for o, the MLP
  product for down;
- attention: queries, keys and values after the rotary embedding and its output;
- the MLP: gate, up and SiLU(gate) (the product is down's input, counted above).

A checkpointed block keeps only its input; one block's activations are rebuilt at a time in backward.
An MLP-only checkpoint keeps the attention's part and the MLP's input. The logits of the whole
micro-batch (vocabulary x tokens) are held in the compute dtype, cast to fp32 by the loss, which keeps
its fp32 log-softmax, and their fp32 gradient appears before those are freed: 14 bytes a logit under
bf16. A fused or chunked loss (Liger's, ktrain-plugin-fused-loss) never holds them.
"""

from __future__ import annotations

import attrs

from ktrain.memory.parts import Checkpointing
from ktrain.memory.shape import ModelShape


@attrs.frozen
class BlockBytes:
    """Bytes a block saves for one token: in full, and what each checkpointing scope keeps."""

    full: int
    checkpointed: int
    mlp_checkpointed: int


def block_bytes(shape: ModelShape, weight_bytes: int, compute_bytes: int, tp: int = 1) -> BlockBytes:
    """What one block saves per token, with weights of ``weight_bytes`` and compute in ``compute_bytes``;
    tensor-parallel ranks divide the heads, the MLP width, and (sequence parallel) the residual stream."""
    h = shape.hidden
    q = shape.heads * shape.head_dim // tp
    kv = max(shape.kv_heads // tp, 1) * shape.head_dim
    i = shape.intermediate // tp
    residual = 2 * weight_bytes * h // tp  # sequence-parallel between blocks
    norms = 2 * weight_bytes * h // tp
    attention = compute_bytes * (h + (q + 2 * kv) + q + (q + kv) + q)  # input cast, qkv, rotary, output
    mlp = compute_bytes * (h + 3 * i + i)  # input cast, gate, up, silu(gate), product
    full = residual + norms + attention + mlp
    return BlockBytes(
        full=full,
        checkpointed=weight_bytes * h // tp,
        mlp_checkpointed=full - mlp + compute_bytes * h,
    )


def saved_activations(
    shape: ModelShape, tokens: int, weight_bytes: int, compute_bytes: int, checkpointing: Checkpointing | None, tp: int
) -> int:
    """Bytes of activations saved across all blocks at the end of forward, plus one block rebuilt in
    backward when blocks are checkpointed; ``tokens`` is this rank's micro-batch (rows x sequence)."""
    per = block_bytes(shape, weight_bytes, compute_bytes, tp)
    if checkpointing is None or checkpointing.fraction <= 0:
        return tokens * shape.layers * per.full
    recomputed = round(shape.layers * min(checkpointing.fraction, 1.0))
    kept = per.checkpointed if checkpointing.scope == "block" else per.mlp_checkpointed
    rebuilt = per.full - kept
    return tokens * ((shape.layers - recomputed) * per.full + recomputed * kept + rebuilt)


def logits_bytes(shape: ModelShape, tokens: int, compute_bytes: int, fused: bool) -> int:
    """Bytes of the logits, their fp32 copy, the loss's log-softmax and the gradient; 0 under a fused loss."""
    return 0 if fused else tokens * shape.vocab * (compute_bytes + 4 + 4 + 4)
