"""``gradient_checkpointing_fraction: auto`` on a GPU: the fewest recomputed blocks that the memory allows.

The budget is the predicted peak per rank of the same config on the plain path, as Axolotl and Hugging Face's
Trainer run it: without ktrain's GPU defaults (every block recomputed, the whole logits, ...) and, where the
config computes in bf16 and does not write ``bfloat16``, with the weights loaded in bf16 (``bfloat16: true``:
gradients and optimizer states in bf16 too); and at most ``GPU_SHARE`` of the GPU's memory. A config that
writes ``gradient_checkpointing: true`` accepted the memory that path takes, so the fast defaults never make a
run need more than the same YAML would there; they spend what they save on recomputing fewer blocks. ``auto``
resolves to the fewest blocks (at least one) whose predicted peak stays within the budget, as a number
(``round(k / blocks, 4)``, which ``recomputed_blocks`` reads back as ``k`` blocks); where the memory model
cannot predict the run (a model it does not know, a plugin that does not answer ``ktrain_collect_memory``, an
unknown GPU), every block recomputes and the origin says why. No torch here but ``gpu_memory``, which reads the
GPUs a run on this machine would use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from ktrain.config.report import ConfigError
from ktrain.config.run_plan import Plan
from ktrain.memory.model import predict
from ktrain.memory.shape import ModelShape, ShapeError, read_shape
from ktrain.plugins import PluginError

KEY = "gradient_checkpointing_fraction"
GPU_SHARE = 0.9
"""The share of the GPU's memory the predicted peak of ``auto``'s choice stays within."""
GIB = 1 << 30


def fraction_of(recomputed: int, blocks: int) -> float:
    """The fraction ``auto`` writes for ``recomputed`` of ``blocks`` blocks (read back as that many)."""
    return 1.0 if recomputed >= blocks else round(recomputed / blocks, 4)


def budget(plain_peak: int, gpu_memory: int) -> int:
    """Bytes the predicted peak of ``auto``'s choice may reach: the plain path's peak, at most ``GPU_SHARE`` of
    the GPU's memory."""
    return min(plain_peak, int(GPU_SHARE * gpu_memory))


def reads_as_pure_bf16(config: Any, capability: tuple[int, int] | None) -> bool:
    """Whether the plain path of ``config`` (read without the GPU defaults) loads its weights in bf16, as Axolotl
    does for ``bf16: true``: bf16 compute, no fp16, and ``bfloat16`` not written."""
    bf16 = config.bf16 is True or (config.bf16 == "auto" and (capability is None or capability >= (8, 0)))
    return bf16 and not config.fp16 and not config.is_set("bfloat16")


def with_fraction(config: Any, fraction: float) -> Any:
    """``config`` with ``gradient_checkpointing_fraction`` set to ``fraction`` (its origin unchanged)."""
    sections = {
        cls: attrs.evolve(obj, **{KEY: fraction}) if KEY in attrs.fields_dict(cls) else obj
        for cls, obj in config.sections.items()
    }
    return attrs.evolve(config, sections=sections)


@attrs.frozen
class FractionChoice:
    """``recomputed`` of ``blocks`` blocks, the predicted peak per rank with them and the budget (bytes)."""

    recomputed: int
    blocks: int
    peak: int
    budget: int

    @property
    def fraction(self) -> float:
        return fraction_of(self.recomputed, self.blocks)

    def describe(self, plain_peak: int, gpu_memory: int) -> str:
        """What the choice was made from, for the line a run prints."""
        within = "within" if self.peak <= self.budget else "above (every block recomputed)"
        return (
            f"{self.recomputed} of {self.blocks} blocks recompute; predicted peak {self.peak / GIB:.1f} GiB {within} "
            f"the budget {self.budget / GIB:.1f} GiB: the plain path's peak, {plain_peak / GIB:.1f} GiB, "
            f"at most {GPU_SHARE:.0%} of the GPU's {gpu_memory / GIB:.1f} GiB"
        )


def choose(config: Any, mesh: Any, plugins: Any, shape: ModelShape, limit: int) -> FractionChoice:
    """The fewest blocks (at least one) whose predicted peak per rank for ``config`` stays within ``limit``; every
    block when none does."""
    blocks = shape.layers
    for recomputed in range(1, blocks + 1):
        peak = predict(with_fraction(config, fraction_of(recomputed, blocks)), mesh, plugins, shape).peak
        if peak <= limit:
            return FractionChoice(recomputed, blocks, peak, limit)
    return FractionChoice(blocks, blocks, peak, limit)


def gpu_memory() -> int | None:
    """The smallest memory of this machine's GPUs, or None where it has none."""
    import torch

    if not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def resolve_auto(plan: Plan, plain: Callable[[], Plan], memory: int | None) -> tuple[float, str]:
    """The number ``auto`` stands for in ``plan`` (a GPU run's), and why: ``plain()`` is the plan of the same config
    on the plain path (without its GPU defaults; bf16 weights where ``reads_as_pure_bf16``), ``memory`` the GPU's
    (None: not known)."""
    config = plan.config
    try:
        shape = read_shape(config)
    except ShapeError as e:
        return 1.0, f"every block recomputes: the memory model cannot predict this run ({e})"
    every = f"all {shape.layers} blocks recompute"
    if memory is None:
        return 1.0, f"{every}: the GPU's memory is not known here"
    missing = predict(config, plan.mesh, plan.plugins, shape).not_modelled
    if missing:
        return 1.0, f"{every}: the memory model does not predict {', '.join(missing)}"
    try:
        base = plain()
    except (ConfigError, PluginError) as e:
        return 1.0, f"{every}: the config on the plain path does not check ({str(e).splitlines()[0]})"
    plain_prediction = predict(base.config, base.mesh, base.plugins, shape)
    if plain_prediction.not_modelled:
        return 1.0, f"{every}: the memory model does not predict {', '.join(plain_prediction.not_modelled)}"
    choice = choose(config, plan.mesh, plan.plugins, shape, budget(plain_prediction.peak, memory))
    return choice.fraction, choice.describe(plain_prediction.peak, memory)
