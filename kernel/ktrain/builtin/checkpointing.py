"""Activation checkpointing: which blocks recompute their forward in backward, applied in one place.

``apply_checkpointing(model, choice)`` is the one function that recomputes a model's blocks; the kernel's
loader calls it for ``gradient_checkpointing`` (``Recompute.from_config``), and a sharding plugin with
checkpointing keys of its own (FSDP's ``activation_checkpointing``) builds a ``Recompute`` from them and
calls it with the block classes it shards.

Two mechanisms, one per kind of caller. Without ``classes``: the model's own switch (transformers'
``gradient_checkpointing_enable``, or ``activation_checkpointing_enable`` where ``offload`` is asked),
which leaves the module tree unchanged, so that adapters (PEFT) find their target names afterwards; for a
``fraction`` below 1 the blocks not chosen then stop recomputing (the ``gradient_checkpointing`` attribute
that each ``GradientCheckpointingLayer`` reads in its forward, set per block).
With ``classes``: the chosen blocks (or their ``mlp``) go into PyTorch's non-reentrant checkpoint
wrappers, which work on any ``nn.Module`` and around FSDP units; the state dict keeps the model's names.
"""

from __future__ import annotations

import inspect
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Literal

import torch
import transformers

from ktrain.config.report import ConfigError


def _non_reentrant() -> dict[str, Any]:
    return {"use_reentrant": False}


@dataclass(frozen=True)
class Recompute:
    """What to recompute in backward.

    ``fraction``: the share of the blocks, spread evenly (at least one); ``scope``: the whole block, or only
    its ``mlp``; ``offload``: keep each block's saved input in pinned host memory until backward (the
    model's own switch only); ``kwargs``: for ``torch.utils.checkpoint`` (the model's own switch only);
    ``key``: the config key an error about ``scope`` names.
    """

    fraction: float = 1.0
    scope: Literal["block", "mlp"] = "block"
    offload: bool = False
    kwargs: Mapping[str, Any] = field(default_factory=_non_reentrant)
    key: str = "gradient_checkpointing"

    @classmethod
    def from_config(cls, config: Any) -> Recompute | None:
        """The kernel's ``gradient_checkpointing``, ``gradient_checkpointing_kwargs`` and
        ``gradient_checkpointing_fraction``; None when false.

        Without a GPU the activations are in host memory already: ``offload`` is ``true`` there
        (transformers' offload would ask for pinned memory, which needs one). A fraction still ``auto`` (a run
        off a GPU: on one, the run's plan resolved it to a number) recomputes every block.
        """
        if not config.gradient_checkpointing:
            return None
        fraction = config.gradient_checkpointing_fraction
        return cls(
            fraction=1.0 if fraction == "auto" else float(fraction),
            offload=config.gradient_checkpointing == "offload" and torch.cuda.is_available(),
            kwargs=config.gradient_checkpointing_kwargs or _non_reentrant(),
        )


def recomputed_blocks(count: int, fraction: float) -> list[int]:
    """Indices of the ``round(count x fraction)`` blocks (at least one) to recompute, spread evenly."""
    chosen = max(1, round(count * fraction))
    return [i for i in range(count) if (i + 1) * chosen // count > i * chosen // count]


def apply_checkpointing(model: torch.nn.Module, choice: Recompute, classes: tuple[type, ...] = ()) -> int:
    """Recompute the blocks of ``model`` in backward as ``choice`` says; returns how many blocks (or MLPs).

    Without ``classes`` the blocks of a transformers model recompute through its own switch: the share
    ``fraction`` of them, spread evenly (``scope`` must be ``"block"``). With ``classes`` the blocks are the
    modules of those classes:
    the share ``fraction`` of them, spread evenly (selective checkpointing by layer, as torchtitan's
    ``selective_ac_option``); ``scope`` ``"mlp"`` recomputes only each chosen block's ``mlp``, which holds
    most of a block's saved activations, and not its attention (Megatron's ``recompute_modules: [mlp]``).
    """
    if not classes:
        if choice.scope != "block":
            raise ValueError("apply_checkpointing: an mlp scope needs the block classes")
        return _model_switch(model, choice)
    if choice.offload:
        raise ValueError("apply_checkpointing: offload is the model's own switch; give no classes")
    return _wrap_blocks(model, choice, classes)


def _model_switch(model: Any, choice: Recompute) -> int:
    """transformers' checkpointing of the chosen blocks; a transformers without ``offload`` recomputes without
    it, and says so. transformers switches every ``GradientCheckpointingLayer`` on; those not chosen are switched
    off again, each by its own ``gradient_checkpointing`` attribute, which its forward reads at every call."""
    kwargs = dict(choice.kwargs)
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None and "offload" in inspect.signature(enable).parameters:
        enable(activation_checkpointing_kwargs=kwargs, offload=choice.offload)
    else:
        if choice.offload:
            warnings.warn(
                f"{choice.key}: offload needs a transformers whose activation_checkpointing_enable takes "
                f"offload (5.24 does; this is {transformers.__version__}): the blocks are recomputed, their "
                "inputs stay on the device",
                stacklevel=1,
            )
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)
    from transformers.modeling_layers import GradientCheckpointingLayer

    blocks = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if choice.fraction >= 1.0:
        return len(blocks)
    if not blocks:
        warnings.warn(
            f"{choice.key}: {type(model).__name__} has no GradientCheckpointingLayer blocks to choose from: "
            "the model's own switch decides what recomputes",
            stacklevel=1,
        )
        return 0
    chosen = set(recomputed_blocks(len(blocks), choice.fraction))
    for i, block in enumerate(blocks):
        block.gradient_checkpointing = i in chosen
    return len(chosen)


def _wrap_blocks(model: torch.nn.Module, choice: Recompute, classes: tuple[type, ...]) -> int:
    """Non-reentrant checkpoint wrappers around the chosen blocks of ``classes`` (or their ``mlp``)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        CheckpointImpl,
        apply_activation_checkpointing,
        checkpoint_wrapper,
    )

    blocks = [m for m in model.modules() if isinstance(m, classes)]
    chosen = [blocks[i] for i in recomputed_blocks(len(blocks), choice.fraction)] if blocks else []
    if choice.scope == "mlp":
        missing = sorted({type(b).__name__ for b in chosen if not isinstance(getattr(b, "mlp", None), torch.nn.Module)})
        if missing:
            raise ConfigError.single(choice.key, f"mlp: {', '.join(missing)} has no `mlp` module; use block")
        chosen = [b.mlp for b in chosen]
    ids = {id(m) for m in chosen}
    apply_activation_checkpointing(
        model,
        checkpoint_wrapper_fn=partial(checkpoint_wrapper, checkpoint_impl=CheckpointImpl.NO_REENTRANT),
        check_fn=lambda module: id(module) in ids,
    )
    return len(chosen)
