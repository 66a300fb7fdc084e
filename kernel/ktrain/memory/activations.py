"""Activation memory of one rank: what each transformer block saves for backward, and the logits.

Counted per token of a block, from the ops a Llama block runs (SDPA attention, which keeps no
sequence-by-sequence scores; ``transformers``' eager RMSNorm, rotary embedding and SiLU-times-up):

- the residual stream at the block's input and between attention and MLP, in the weights' dtype
  (fp32 under autocast with fp32 weights);
- each norm's normalized output (weights' dtype) and the inputs of the projections, cast to the
  compute dtype: the norm output for q/k/v and for gate/up, the attention output for o, the MLP
  product for down;
- attention: queries, keys and values, the rotary embedding's inputs (and their rotated halves) and
  the attention's output (SDPA with grouped-query attention does not repeat the keys and values);
- the MLP: gate, up and SiLU(gate) (the product is down's input, counted above).

A checkpointed block keeps only its input; one block's activations are rebuilt at a time in backward.
An MLP-only checkpoint keeps the attention's part and the MLP's input. After the blocks, the final
norm's output and the output layer's input are kept. The loss casts the logits of the whole
micro-batch (vocabulary x tokens) to fp32 and keeps its fp32 log-softmax; its backward holds that, the
incoming fp32 gradient and the gradient of its input at once: 12 bytes a logit, the step's peak in most
runs. A fused or chunked loss (Liger's, ktrain-plugin-fused-loss in chunks) never holds them;
ktrain-plugin-fused-loss in one chunk holds the logits' gradient in the compute dtype.
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


def block_bytes(
    shape: ModelShape, weight_bytes: int, compute_bytes: int, tp: int = 1, kernels: frozenset[str] = frozenset()
) -> BlockBytes:
    """What one block saves per token, with weights of ``weight_bytes`` and compute in ``compute_bytes``;
    tensor-parallel ranks divide the heads, the MLP width, and (sequence parallel) the residual stream.
    ``kernels`` names fused ops that save less: ``rms_norm`` (keeps no normalized output), ``rope`` (no
    rotated halves), ``swiglu`` (keeps gate and up, not SiLU(gate)), and the projections whose input is
    kept in float8, a byte an element: ``float8_gate_up`` (the MLP's input), ``float8_down`` (its product)."""
    h = shape.hidden
    q = shape.heads * shape.head_dim // tp
    kv = max(shape.kv_heads // tp, 1) * shape.head_dim
    i = shape.intermediate // tp
    residual = 2 * weight_bytes * h // tp  # sequence-parallel between blocks
    norms = 0 if "rms_norm" in kernels else 2 * weight_bytes * h // tp
    rotary = 0 if "rope" in kernels else 2 * (q + kv)
    attention = compute_bytes * (h + (q + 2 * kv) + rotary + q)  # input cast, qkv, rotary, output
    mlp_input = (1 if "float8_gate_up" in kernels else compute_bytes) * h
    product = (1 if "float8_down" in kernels else compute_bytes) * i
    mlp = mlp_input + compute_bytes * (2 if "swiglu" in kernels else 3) * i + product  # gate, up, silu(gate)
    full = residual + norms + attention + mlp
    return BlockBytes(
        full=full,
        checkpointed=weight_bytes * h // tp,
        mlp_checkpointed=full - mlp + compute_bytes * h,
    )


@attrs.frozen
class Activations:
    """Bytes of activations: ``saved`` across the blocks (and after them) at the end of forward, and
    ``rebuilt``, the one block recomputed at a time in backward when blocks are checkpointed."""

    saved: int
    rebuilt: int


def activations(
    shape: ModelShape,
    tokens: int,
    weight_bytes: int,
    compute_bytes: int,
    checkpointing: Checkpointing | None,
    tp: int,
    kernels: frozenset[str] = frozenset(),
) -> Activations:
    """The activations of ``tokens`` (this rank's micro-batch: rows x sequence) through every block."""
    per = block_bytes(shape, weight_bytes, compute_bytes, tp, kernels)
    head = tokens * shape.hidden * (weight_bytes + compute_bytes)  # final norm's output, output layer's input
    if checkpointing is None or checkpointing.fraction <= 0:
        return Activations(tokens * shape.layers * per.full + head, 0)
    recomputed = max(1, round(shape.layers * min(checkpointing.fraction, 1.0)))  # as recomputed_blocks chooses
    kept = per.checkpointed if checkpointing.scope == "block" else per.mlp_checkpointed
    saved = tokens * ((shape.layers - recomputed) * per.full + recomputed * kept) + head
    return Activations(saved, tokens * (per.full - kept) if recomputed else 0)


LOSS_BYTES = 12
"""Bytes a logit the unfused loss holds at its backward: the fp32 log-softmax, its gradient, the input's."""


def logits_bytes(shape: ModelShape, tokens: int, loss: str | int | None = None) -> int:
    """Bytes the loss holds at its backward: ``LOSS_BYTES`` a logit, none under a ``"fused"`` loss, or ``loss``
    bytes a logit (a fused loss that keeps the logits' gradient)."""
    if loss == "fused":
        return 0
    return tokens * shape.vocab * (LOSS_BYTES if loss is None else int(loss))
