"""Fast defaults: on a GPU, a key the config does not write takes the value of the fastest correct path.

A key declares its GPU default in its field (``key(..., gpu_default=GpuDefault(...))``, kernel or plugin
alike): the value, the other keys that value needs (``also``), a check of the rest of the config saying why
the default does not apply there (``unless``), and what it changes in what is trained. ``ktrain run`` (and
``ktrain bench``, ``ktrain plan --measure``) resolve them where the device is known, before the plugins are
activated: a key the user wrote, even to its ordinary default, is never changed, and on a CPU nothing is.
The resolved keys are written into the run's ``config.yaml`` like any written key, so every rank, and a
resume, trains with them. Imports no torch.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from ktrain.config.model import Config

ORIGIN = "fast default on CUDA"
"""The origin (``ktrain check``'s "from") of a key set by its GPU default."""
RESOLVED = "auto, resolved on CUDA"
"""The origin of a key written ``auto`` that a GPU run resolved to a value (``gradient_checkpointing_fraction``);
a resolved key's origin may go on after either, with ``: `` and what the value was chosen from."""


@attrs.frozen
class GpuDefault:
    """A key's value on a GPU when the config does not write the key.

    ``value``: the key's value there; ``also``: other keys set with it, or a function of the config giving
    them (``unless`` decides which values of them the config may write: those it replaces);
    ``unless(config, capability)``: why the default does not apply to this config (None: it applies;
    ``capability`` is the GPUs' lowest compute capability, None where unknown); ``changes``: what the
    default changes in what is trained (docs and ``ktrain check``); ``off``: the value that switches it off
    (None: ``false`` for a default of ``true``, else the key's own value).
    """

    value: Any
    changes: str
    also: dict[str, Any] | Callable[[Any], dict[str, Any]] = attrs.field(factory=dict)
    unless: Callable[[Any, tuple[int, int] | None], str | None] | None = None
    off: Any = None

    def also_for(self, config: Any) -> dict[str, Any]:
        """The other keys set with the value in ``config``."""
        return self.also(config) if callable(self.also) else dict(self.also)


@attrs.frozen
class Choice:
    """One GPU default taken (or, for ``ktrain check``, that a GPU run would take)."""

    key: str
    value: Any
    also: dict[str, Any]
    changes: str
    off: Any = None
    why: str = ""

    def line(self) -> str:
        """The line ``ktrain run`` prints at its start and ``ktrain check`` lists; ``why``: what a resolved value
        was chosen from."""
        shown = ", ".join(f"{k}: {_yaml(v)}" for k, v in self.also.items())
        off = _yaml(self.off) if self.off is not None else "false" if self.value is True else "its value"
        return (
            f"{self.key}: {_yaml(self.value)}{f' with {shown}' if shown else ''} "
            f"({f'{self.why}; ' if self.why else ''}fast default on CUDA; set {self.key}: {off} to switch off)"
        )


def model_config(config: Any) -> dict[str, Any]:
    """The config's model's ``config.json`` read without loading anything: a local folder, or a hub id already in
    the Hugging Face cache (empty where neither has it): for an ``unless`` or ``also`` that depends on the
    architecture or the model's sizes."""
    source = config.base_model_config or config.base_model
    if not source:
        return {}
    path = Path(source) / "config.json"
    if not path.is_file():
        from huggingface_hub import try_to_load_from_cache

        cached = try_to_load_from_cache(source, "config.json", revision=config.revision_of_model)
        path = Path(cached) if isinstance(cached, str) else path
    try:
        read = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return read if isinstance(read, dict) else {}


def model_type(config: Any) -> str | None:
    """The ``model_type`` of the config's model (``model_config``), None where it is not known."""
    return model_config(config).get("model_type")


def attention(config: Any) -> str:
    """The attention implementation the config asks for (its older keys read; SDPA where it names none), before
    the fallbacks of the machine it runs on (``ktrain.builtin.hf_model.attention_implementation``)."""
    if config.attn_implementation:
        return config.attn_implementation
    return "flash_attention_2" if config.flash_attention else "flex_attention" if config.flex_attention else "sdpa"


def _yaml(value: Any) -> str:
    return {True: "on", False: "off", None: "null"}.get(value, str(value)) if isinstance(value, bool) else str(value)


def _declared(config: Config) -> list[tuple[str, GpuDefault]]:
    """Every key of the config with a GPU default, in section order."""
    return [
        (f.name, f.metadata["gpu_default"])
        for section in config.sections.values()
        for f in attrs.fields(type(section))
        if f.metadata.get("gpu_default") is not None
    ]


def pending(config: Config, capability: tuple[int, int] | None = None) -> list[Choice]:
    """The GPU defaults a GPU run of ``config`` takes: keys neither written nor null whose ``unless`` finds
    nothing against them."""
    found = []
    for name, default in _declared(config):
        if config.is_set(name) or name in config.unset:
            continue
        if default.unless is not None and default.unless(config, capability) is not None:
            continue
        found.append(Choice(name, default.value, default.also_for(config), default.changes, default.off))
    return found


def applied(config: Config) -> list[Choice]:
    """The GPU defaults ``resolve`` set in ``config``, and the keys written ``auto`` a GPU run resolved (read from
    the keys' origins)."""
    found = []
    for name, default in _declared(config):
        origin, _, why = config.origins.get(name, "").partition(": ")
        if origin in (ORIGIN, RESOLVED):
            found.append(Choice(name, getattr(config, name), _also(config, default), default.changes, default.off, why))
    return found


def _also(config: Config, default: GpuDefault) -> dict[str, Any]:
    return {k: getattr(config, k) for k in default.also_for(config) if config.origins.get(k) == ORIGIN}


def resolve(config: Config, device: str | None, capability: tuple[int, int] | None = None) -> Config:
    """``config`` with the GPU defaults of ``pending`` set (present, from ``ORIGIN``) when ``device`` is
    ``cuda``; otherwise ``config`` itself."""
    if device != "cuda":
        return config
    choices = pending(config, capability)
    if not choices:
        return config
    values = {name: value for c in choices for name, value in {c.key: c.value, **c.also}.items()}
    sections = {}
    for cls, section in config.sections.items():
        mine = {f.name: values[f.name] for f in attrs.fields(cls) if f.name in values}
        sections[cls] = attrs.evolve(section, **mine) if mine else section
    return attrs.evolve(
        config,
        sections=sections,
        present=config.present | set(values),
        origins={**config.origins, **dict.fromkeys(values, ORIGIN)},
    )


def resolved(config: Config, key: str, value: Any, why: str) -> Config:
    """``config`` with ``key``, a GPU default or written ``auto``, resolved to ``value`` (present; its origin
    ``ORIGIN`` or ``RESOLVED``, then ``: `` and ``why``)."""
    origin = ORIGIN if config.origins.get(key) == ORIGIN else RESOLVED
    sections = {
        cls: attrs.evolve(obj, **{key: value}) if key in attrs.fields_dict(cls) else obj
        for cls, obj in config.sections.items()
    }
    return attrs.evolve(
        config, sections=sections, present=config.present | {key}, origins={**config.origins, key: f"{origin}: {why}"}
    )


ADAMW = ("adamw", "adamw_torch", "adamw_torch_fused", "adamw_fp32_master")
"""The optimizer names whose update ``adamw_fp32_master`` computes too (on fp32 master copies)."""


def _adapter(config: Any) -> bool:
    return getattr(config, "adapter", None) is not None


def _quantized(config: Any) -> bool:
    quantized = getattr(config, "load_in_4bit", False) or getattr(config, "load_in_8bit", False)
    return bool(quantized) or getattr(config, "adapter", None) == "qlora"


def _masters_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why ``bfloat16`` (with ``adamw_fp32_master`` where the whole model trains) is not the fast default of
    ``config`` (None: it is)."""
    bf16 = config.bf16 is True or (config.bf16 == "auto" and (capability is None or capability >= (8, 0)))
    fsdp = any(config.is_set(k) for k in ("fsdp", "fsdp_config", "fsdp_version"))
    adapter = _adapter(config)
    reasons = (
        (not bf16 or config.fp16, "the compute dtype is not bf16"),
        (not adapter and config.optimizer not in ADAMW, f"{config.optimizer} is not AdamW"),
        (getattr(config, "deepspeed", None) is not None, "DeepSpeed keeps fp32 masters of its own"),
        (_quantized(config) and not adapter, "a quantized base loads its other weights in the compute dtype already"),
        (getattr(config, "load_in_8bit", False), "an 8-bit base keeps fp32 adapter weights"),
        (adapter and fsdp, "FSDP would shard a bf16 base and fp32 adapter weights together"),
        (fsdp and getattr(config, "fsdp_version", None) != 2, "only FSDP2 shards fp32 masters"),
        (
            not adapter and config.gradient_accumulation_steps > 1,
            "bf16 gradients would be summed over the micro-batches",
        ),
    )
    return next((why for found, why in reasons if found), None)


def _masters_also(config: Any) -> dict[str, Any]:
    """The optimizer ``bfloat16``'s default sets: ``adamw_fp32_master``, except where an adapter trains with an
    optimizer that is not AdamW, or over several micro-batches (its bf16 gradients would be summed in bf16): there
    the adapter trains in fp32 with the optimizer as written."""
    fp32_adapter = _adapter(config) and (config.optimizer not in ADAMW or config.gradient_accumulation_steps > 1)
    return {} if fp32_adapter else {"optimizer": "adamw_fp32_master"}


FP32_MASTERS = GpuDefault(
    True,
    "bf16 weights, gradients and activations (the residual stream too) instead of fp32 weights under bf16 "
    "autocast; the optimizer keeps fp32 master weights and fp32 AdamW states, so no update is lost to bf16 "
    "rounding; checkpoints and the exported model hold bf16 weights. With an adapter the frozen base is bf16 "
    "(the values bf16 autocast gives its matrix multiplies; a 4-bit base keeps its 4-bit weights and computes in "
    "bf16), and so are the adapter's weights and gradients, "
    "with fp32 masters and AdamW states in the optimizer (the values autocast computes with, no casts of them "
    "in the forward and backward; the exported adapter holds bf16 weights); where the adapter's optimizer is "
    "not AdamW or micro-batches accumulate, its weights stay fp32 with the optimizer as written",
    also=_masters_also,
    unless=_masters_unless,
)
"""The kernel's GPU default of ``bfloat16``: bf16 weights with fp32 masters in the optimizer; with an adapter,
a bf16 frozen base."""


def check_fraction(instance: Any, attribute: Any, value: Any) -> None:
    """``gradient_checkpointing_fraction``: above 0 and at most 1, or ``auto`` (an attrs validator)."""
    if value != "auto" and not (isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1):
        raise ValueError(f"must be above 0 and at most 1, or auto, not {value!r}")


def _fraction_unless(config: Any, capability: tuple[int, int] | None) -> str | None:
    """Why ``gradient_checkpointing_fraction: auto`` is not the fast default of ``config`` (None: it is)."""
    fsdp = any(config.is_set(k) for k in ("fsdp", "fsdp_config", "fsdp_version"))
    reasons = (
        (config.gradient_checkpointing is False, "gradient_checkpointing is false"),
        (
            config.gradient_checkpointing == "offload",
            "gradient_checkpointing: offload asks for the least device memory, not for speed",
        ),
        (
            fsdp or getattr(config, "deepspeed", None) is not None,
            "a sharded run's predicted peak per rank is not yet checked against several ranks' measured peaks",
        ),
    )
    return next((why for found, why in reasons if found), None)


AUTO_FRACTION = GpuDefault(
    "auto",
    "the blocks that need not recompute keep their activations: the same loss and gradients, less recomputation; "
    "a GPU run resolves auto to the share of the blocks the memory model chooses (the fewest whose predicted "
    "peak stays within the budget) and writes it into the run's config.yaml",
    unless=_fraction_unless,
    off=1.0,
)
"""The kernel's GPU default of ``gradient_checkpointing_fraction``: recompute only the blocks the memory needs."""
