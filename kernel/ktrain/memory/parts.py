"""The vocabulary of ``ktrain_collect_memory``: what a plugin tells the memory model, and what it gets back.

A plugin answers with a mapping; each name has one meaning and one owner in a run:

- ``"weights"``: a ``WeightsModel``, which rewrites the list of parameter tensors (an adapter adds its
  own trained tensors and freezes the base; a quantizer packs the base);
- ``"sharding"``: a ``ShardingModel``, which says what one rank holds of the parameters, gradients,
  master weights and optimizer states (DDP, FSDP, ZeRO), and of the communication buffers;
- ``"optimizer"``: an ``OptimizerModel``, the optimizer's states per trained element;
- ``"parallel"``: a ``ParallelModel``, how tensor and context parallelism split weights and activations;
- ``"loss"``: ``"fused"`` when the logits of the whole sequence are never materialized, or the bytes a
  logit of the micro-batch that the loss holds at its backward (a fused loss keeping the logits' gradient);
- ``"checkpointing"``: a ``Checkpointing``, which blocks recompute their activations (a plugin that owns
  activation checkpointing);
- ``"kernels"``: names of fused ops that save less for backward: ``rms_norm``, ``rope``, ``swiglu``;
- ``"compiled"``: the same names, for the ops a compiler fuses inside the blocks (it recomputes their
  pointwise work in backward rather than saving it); joined with ``"kernels"``;
- ``"float8"``: the projections whose input a block keeps in float8 for backward, a byte an element:
  ``float8_gate_up`` (the MLP's input, when gate and up both multiply in float8), ``float8_down`` (the
  MLP's product); joined with ``"kernels"``;
- ``"pairs"``: a ``PairsModel``, a preference run's forward (rows a sample, the reference copy, the loss's chunk);
- ``"attention"``: the name of a kernel a plugin puts behind the model's attention that saves for backward what
  SDPA's fused kernels save (its inputs, its output and a log-sum-exp a head and token), as the model counts.

Nothing here imports torch.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol

import attrs


@attrs.frozen
class Weight:
    """One parameter tensor as the run holds it.

    ``element_bytes`` is 4 (fp32), 2 (bf16, fp16) or 1 (8-bit); a packed 4-bit tensor is described as it is
    stored (a column of elements of its storage dtype); ``extra_bytes`` counts what a quantized tensor keeps
    beside its packed data (its quantization state: block scales, code tables), not divided by a sharding.
    ``trainable`` weights get gradients and optimizer states. ``kind`` and ``block`` are those of
    ``ktrain.memory.shape.Tensor``.
    """

    name: str
    shape: tuple[int, ...]
    kind: str
    block: int | None
    element_bytes: float
    trainable: bool = True
    extra_bytes: int = 0

    @property
    def numel(self) -> int:
        """Elements of the tensor."""
        return math.prod(self.shape)

    @property
    def bytes(self) -> int:
        """Bytes of the whole tensor, on one rank, unsharded."""
        return math.ceil(self.numel * self.element_bytes) + self.extra_bytes

    @property
    def matrix(self) -> bool:
        """Whether weight decay applies (2-D and up): the kernel's first parameter group."""
        return len(self.shape) >= 2


@attrs.frozen
class OptimizerModel:
    """An optimizer's memory per trained tensor.

    ``moments`` states of the tensor's size each, of ``moment_bytes`` per element (None: the weight's own
    dtype); a quantized state keeps one fp32 scale per ``block`` elements, and tensors below
    ``min_quantized`` elements keep fp32 states instead. ``master`` keeps an fp32 copy of each trained
    weight as optimizer state (when the weight itself is not fp32).
    """

    name: str
    moments: int = 2
    moment_bytes: float | None = None
    block: int = 0
    min_quantized: int = 0
    master: bool = False

    def state_bytes(self, numel: int, element_bytes: float) -> int:
        """Bytes of the states (moments and master copy) of a trained tensor of ``numel`` elements."""
        master = 4 * numel if self.master and element_bytes != 4 else 0
        if self.moment_bytes is None:
            return master + self.moments * math.ceil(numel * element_bytes)
        if numel < self.min_quantized:
            return master + self.moments * 4 * numel
        scales = 4 * math.ceil(numel / self.block) if self.block else 0
        return master + self.moments * (math.ceil(numel * self.moment_bytes) + scales)


@attrs.frozen
class ModelStates:
    """What one rank holds of the model's state, in bytes; ``host`` holds what is offloaded to CPU memory.

    ``buffers`` are the sharding's communication and gather buffers during forward and backward (DDP's
    gradient buckets, FSDP's all-gathered units, ZeRO's reduce buckets); ``last_reduce``, when not None, is
    what it holds beside the gradients at the end of backward in their place (FSDP2's reduce-scatter of its
    root unit, whose weights are gathered no more).
    """

    parameters: int
    gradients: int
    optimizer: int
    buffers: int = 0
    host: dict[str, int] = attrs.Factory(dict)
    last_reduce: int | None = None

    @property
    def end_of_backward(self) -> int:
        """Bytes the sharding holds beside the gradients at the end of backward."""
        return self.buffers if self.last_reduce is None else self.last_reduce


class WeightsModel(Protocol):
    """``"weights"``: rewrites the run's parameter tensors (adapters, quantized bases)."""

    def __call__(self, weights: list[Weight]) -> list[Weight]: ...


class ShardingModel(Protocol):
    """``"sharding"``: what rank ``rank`` holds of ``weights`` under ``optimizer``.

    ``weight_bytes``, when not None, is the dtype the sharding computes with (FSDP's mixed precision,
    DeepSpeed's bf16): the residual stream between blocks is kept in it.

    A model may also give ``frozen_copy(weights, rank) -> int``: the bytes rank ``rank`` holds of a frozen copy
    of ``weights`` that its plugin shards (``ktrain_shard_frozen``, e.g. a preference run's reference); without
    it the copy is counted whole on every rank.
    """

    name: str
    weight_bytes: int | None

    def states(self, weights: Sequence[Weight], optimizer: OptimizerModel, rank: int) -> ModelStates: ...


@attrs.frozen
class ParallelModel:
    """``"parallel"``: tensor-parallel ranks divide each block's projections and activations, context-parallel
    ranks (and Ulysses sequence-parallel ranks) divide each row's sequence."""

    tp: int = 1
    cp: int = 1

    def split(self, weights: list[Weight]) -> list[Weight]:
        """The weights one tensor-parallel rank holds (Megatron's layout): q/k/v, gate and up split by output,
        o and down by input, the embedding and the output layer by vocabulary; norms whole."""
        if self.tp == 1:
            return weights
        out = []
        for w in weights:
            if w.kind in ("linear", "embedding", "lm_head"):
                by_input = w.name.endswith(("o_proj.weight", "down_proj.weight"))
                rows, cols = w.shape
                shape = (rows, math.ceil(cols / self.tp)) if by_input else (math.ceil(rows / self.tp), cols)
                w = attrs.evolve(w, shape=shape, extra_bytes=w.extra_bytes // self.tp)
            out.append(w)
        return out


@attrs.frozen
class PairsModel:
    """``"pairs"``: a preference run forwards ``rows`` sequences a sample (chosen and rejected at once), holds a
    frozen copy of the model as loaded when ``reference_copy``, and its loss holds ``loss_bytes`` at its backward
    in place of the whole micro-batch's logits (log-probabilities computed a chunk of logits at a time)."""

    rows: int = 2
    reference_copy: bool = False
    loss_bytes: int = 0


@attrs.frozen
class Checkpointing:
    """``"checkpointing"``: the share of blocks whose activations are recomputed, and what each recomputes
    (``"block"``: all of it, keeping only its input; ``"mlp"``: only its MLP)."""

    fraction: float = 1.0
    scope: str = "block"
