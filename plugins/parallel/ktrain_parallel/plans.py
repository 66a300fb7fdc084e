"""Tensor-parallel plans (DTensor) for the Llama, Mistral, Qwen2 and Qwen3 families of transformers.

Megatron's layout: the q/k/v and gate/up projections split by output (column-wise), the o and down
projections by input (row-wise), so each block needs one reduction per sub-layer. Between blocks the
activations stay split along the sequence (Megatron sequence parallelism): the norms run on a sequence
shard, an all-gather enters attention and the MLP, a reduce-scatter leaves them. The embedding is split
by vocabulary; the output layer by vocabulary too, its logits gathered whole for the loss.

Loss parallelism (the cross entropy over vocabulary-sharded logits) is not used: transformers' loss
takes a plain tensor, and the fused linear cross entropy of ktrain-plugin-liger, which avoids whole
logits altogether, takes plain tensors as well. The gathered logits cost one ``[tokens, vocab]``
tensor per rank.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    parallelize_module,
)

# model_type -> extra per-block entries (Qwen3 normalises each head's q and k: heads are dim 2 there)
EXTRA_BLOCK_PLANS = {
    "qwen3": lambda: {
        "self_attn.q_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
        "self_attn.k_norm": SequenceParallel(sequence_dim=2, use_local_output=True),
    }
}


def block_plan(model_type: str) -> dict[str, Any]:
    """The plan of one decoder block: its input and output are sequence shards ``Shard(1)``."""
    gathered = {"hidden_states": Replicate()}
    return {
        "input_layernorm": SequenceParallel(),
        "self_attn": PrepareModuleInput(
            input_kwarg_layouts={"hidden_states": Shard(1)}, desired_input_kwarg_layouts=gathered
        ),
        "self_attn.q_proj": ColwiseParallel(),
        "self_attn.k_proj": ColwiseParallel(),
        "self_attn.v_proj": ColwiseParallel(),
        "self_attn.o_proj": RowwiseParallel(output_layouts=Shard(1)),
        "post_attention_layernorm": SequenceParallel(),
        "mlp": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "mlp.gate_proj": ColwiseParallel(),
        "mlp.up_proj": ColwiseParallel(),
        "mlp.down_proj": RowwiseParallel(output_layouts=Shard(1)),
        **EXTRA_BLOCK_PLANS.get(model_type, dict)(),
    }


def apply_tensor_parallel(model: torch.nn.Module, tp_mesh: Any) -> None:
    """Split ``model`` (a ``*ForCausalLM`` of a supported family) over the 1-D ``tp_mesh``, in place."""
    model_type = model.config.model_type
    parallelize_module(
        model,
        tp_mesh,
        {
            "model.embed_tokens": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "model.norm": SequenceParallel(use_local_output=True),
            "lm_head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),
        },
    )
    if model.config.tie_word_embeddings:  # each side was distributed apart: tie them again (both Shard(0))
        model.lm_head.weight = model.model.embed_tokens.weight
    plan = block_plan(model_type)
    for block in model.model.layers:
        parallelize_module(block, tp_mesh, plan)
