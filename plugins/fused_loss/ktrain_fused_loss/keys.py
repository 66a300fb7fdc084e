"""The config keys of ktrain-plugin-fused-loss: ``fused_linear_cross_entropy``, its chunks and its float8
products (no torch here)."""

from __future__ import annotations

from typing import Any

import attrs

from ktrain.config.fast_defaults import ORIGIN, GpuDefault, model_config, model_type
from ktrain.config.keys import key

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3", "phi3")
"""Architectures whose causal-LM head is a plain product and whose loss is the plain token cross entropy (no
logit scaling or soft-capping as in Gemma, Cohere or Granite; no router loss as in the MoE models)."""

PARALLEL_SIZES = ("tensor_parallel_size", "context_parallel_size", "sequence_parallel_degree")
"""Mesh sizes under which the fused loss is refused: the output layer split over the vocabulary (tensor
parallelism) or the tokens over ranks in ways the loss's divisor and label shift do not follow yet."""


def _fused_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why the fused loss is not the fast default of ``config`` (None: it is)."""
    if any(getattr(config, name, None) not in (None, 1) for name in PARALLEL_SIZES):
        return "a parallel size other than 1"
    if getattr(config, "liger_fused_linear_cross_entropy", False) or getattr(config, "liger_cross_entropy", False):
        return "Liger's loss is asked for"
    if getattr(config, "rl", None) is not None:  # ktrain-plugin-preference's key: present when it is installed
        return "a preference method (rl) computes its own loss"
    if model_type(config) not in SUPPORTED:
        return "the model's architecture is not one the fused loss supports (or not known before it loads)"
    return None


FLOAT8_CAPABILITY = (8, 9)
"""The first CUDA compute capability with float8 tensor cores (Ada, then Hopper's 9.0)."""


def _fused(config: Any, capability: tuple[int, int] | None) -> bool:
    """Whether ``config`` computes the fused loss: written true, or its fast default applies."""
    name = "fused_linear_cross_entropy"
    if config.is_set(name) or name in config.unset:
        return bool(config.fused_linear_cross_entropy)
    return _fused_unless(config, capability) is None


def _float8_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why the output layer's products in float8 are not the fast default of ``config`` (None: they are): only
    where the blocks train in float8 (``fp8``, ktrain-plugin-fp8's key: present when it is installed)."""
    if not getattr(config, "fp8", False):
        return "fp8 is off"
    if not _fused(config, capability):
        return "the fused loss is off"
    if config.fused_linear_cross_entropy_chunks != 1:
        return "the fused loss runs in chunks"
    if capability is not None and tuple(capability) < FLOAT8_CAPABILITY:
        return "the GPU has no float8 tensor cores"
    return None


CHUNK_LOGITS = 1 << 28
"""The most logits a chunk holds where the fused loss's GPU default splits the tokens (512 MiB in bf16)."""

HEAD_NAMES = ("lm_head", "embed", "wte", "output")
"""Names by which a config may train the output layer, or the input embeddings it may share."""


def _frozen_head(config: Any) -> bool:
    """Whether the output layer stays frozen: an adapter trains, and no key names the output layer or the
    embeddings (``lora_modules_to_save``, ``lora_target_modules``, ``unfrozen_parameters``)."""
    if getattr(config, "adapter", None) is None:
        return False
    for name in ("lora_modules_to_save", "lora_target_modules", "unfrozen_parameters"):
        written = getattr(config, name, None) or []
        items = [written] if isinstance(written, str) else written
        if any(part in str(item) for item in items for part in HEAD_NAMES):
            return False
    return True


def _chunks_also(config: Any) -> dict[str, Any]:
    """The chunks the fused loss's GPU default takes: with a frozen output layer, as many as keep a chunk's logits
    within ``CHUNK_LOGITS``. Its gradient then is not held from the forward to the backward, at no cost: there is no
    weight gradient to add up over the chunks, and the products are the same, in smaller pieces. None written
    by the config is replaced."""
    name = "fused_linear_cross_entropy_chunks"
    if not _frozen_head(config) or (config.is_set(name) and config.origins.get(name) != ORIGIN):
        return {}
    vocab = model_config(config).get("vocab_size")
    if not isinstance(vocab, int):
        return {}
    chunks = -(-config.micro_batch_size * config.sequence_len * vocab // CHUNK_LOGITS)
    return {name: chunks} if chunks > 1 else {}


@attrs.define(kw_only=True)
class FusedLossKeys:
    """The output layer and the cross entropy in one autograd function, with no host synchronization."""

    fused_linear_cross_entropy: bool = key(
        False,
        "compute the output layer and the token-sum cross entropy together: the gradient overwrites the "
        "bf16 logits in the forward, the logits are never upcast, and no step waits for the device",
        gpu_default=GpuDefault(
            True,
            "the same loss and gradient; the logits are not held in fp32 for the loss, so it is rounded differently; "
            "with a frozen output layer (an adapter) the tokens in chunks of at most 2**28 logits, the products of "
            "the backward run in the forward and no gradient of the logits is held until the backward",
            also=_chunks_also,
            unless=_fused_unless,
        ),
    )
    fused_linear_cross_entropy_chunks: int = key(
        1,
        "split the tokens into this many chunks in the forward: with 1 the gradient of all the logits "
        "(tokens x vocab in the compute dtype) is held until the backward, which is fastest; more chunks "
        "hold one chunk's logits at a time",
    )
    fused_linear_cross_entropy_fp8: bool = key(
        False,
        "run the output layer's three products in float8 (tensorwise e4m3 hidden states and weight; the loss "
        "writes the logits' gradient in e5m2 with a fixed scale, as it is bounded); a GPU of compute "
        "capability 8.9 or later, fused_linear_cross_entropy_chunks: 1",
        gpu_default=GpuDefault(
            True,
            "where the blocks train in float8 (fp8): the output layer's three products in float8 too, its hidden "
            "states and weight in e4m3 with their own scales and the logits' gradient in e5m2 with a fixed scale",
            unless=_float8_unless,
        ),
    )
