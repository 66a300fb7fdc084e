"""Axolotl's keys in a ktrain config: a note for each key with nothing to do here, a refusal naming what
ktrain offers for each key it does not support, and the ``plugins:`` list.

The catalogue is data (``ktrain.config.axolotl_keys``); a key a registered section declares is *owned*
and never reaches this module. Keys outside the catalogue are left for the "unknown key" error.
"""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

import attrs

from ktrain.config.axolotl_keys import ACCEPTED, ACCEPTED_INTEGRATIONS, INTEGRATIONS, OPTIMIZER_PLUGINS, UNSUPPORTED
from ktrain.config.install import install_command
from ktrain.config.keys import PLUGIN_KEYS
from ktrain.config.report import Report

# Top-level keys whose items or keys are catalogued under a prefix: ``datasets[].name``, ``fsdp_config.name``.
NESTED = {"datasets": "datasets[]", "test_datasets": "datasets[]", "pretraining_dataset": "datasets[]"}
NESTED_MAPPINGS = ("fsdp_config",)
INTEGRATION_PREFIX = "axolotl.integrations."
# attn_implementation values of Axolotl that name another kernel for the same exact attention.
QUANTIZATION_KWARGS = "model_quantization_config_kwargs"
# Prefixes of Axolotl's dataset types for trainers ktrain does not have, and the reason (that of the trainer's keys).
FOREIGN_TYPES = {
    "ebft_": next(reason for reason, names in UNSUPPORTED.items() if "ebft" in names),
    "bradley_terry": next(reason for reason, names in UNSUPPORTED.items() if "reward_model" in names),
}
SAME_ATTENTION = {"xformers": "sdpa", "kernels-community/vllm-flash-attn3": "flash_attention_2"}
# With processor_type, Axolotl reads type: chat_template rows with its multimodal strategy: in ktrain the format
# ktrain-plugin-vision registers for chat rows with images.
PROCESSOR_FORMAT = "chat_template.vision"

_CLASS = {name: ("accepted", reason) for reason, names in ACCEPTED.items() for name in names}
_CLASS |= {name: ("unsupported", reason) for reason, names in UNSUPPORTED.items() for name in names}


def classify(name: str) -> tuple[str, str] | None:
    """``("accepted" | "unsupported", reason)`` of a catalogued key that no section owns (nested keys as
    ``datasets[].name``), or None for a key outside the catalogue."""
    return _CLASS.get(name)


def missing_optimizer(name: str) -> str | None:
    """The error for an ``optimizer`` value that no installed plugin registers and a first-party plugin does:
    the plugin and its install command. None for any other name."""
    for distribution, names in OPTIMIZER_PLUGINS.items():
        if name in names:
            return f"'{name}' is registered by {distribution}, not installed: `{install_command(distribution)}`"
    return None


def sift(data: dict[Any, Any], sections: dict[str, type], report: Report, installed: set[str]) -> dict[Any, Any]:
    """``data`` without the catalogued keys that no section owns, each noted (accepted) or refused
    (unsupported) in ``report``; ``plugins:`` is checked and left out.

    ``sections`` maps every owned top-level key to the attrs class that declares it; the keys inside
    ``datasets`` items and ``fsdp_config`` are owned when the class of that key declares them.
    """
    kept: dict[Any, Any] = {}
    first_party = {key for keys in PLUGIN_KEYS.values() for key in keys}
    for name, value in data.items():
        if not isinstance(name, str) or value is None:
            kept[name] = value
        elif name in sections:
            kept[name] = _sift_inside(name, value, sections[name], report)
        elif name == "plugins":
            check_plugins(value, report, installed)
        elif name in TRANSLATED:
            pass  # translated below, once every key is read
        elif name in first_party or (verdict := classify(name)) is None:
            kept[name] = value  # a first-party plugin's key (named with its install command) or unknown
        else:
            _judge(name, value, verdict, report)
    for name, translate in TRANSLATED.items():
        if data.get(name) is not None:
            translate(data[name], kept, report)
    if kept.pop(QUANTIZATION_KWARGS, None) is not None:
        report.error(QUANTIZATION_KWARGS, "configures model_quantization_config, which is not written; leave it out")
    _checkpointing_once(kept, report)
    _older_spellings(kept, report)
    _foreign_dataset_types(kept, report)
    _processor_datasets(kept)
    written = kept.get("attn_implementation")
    if isinstance(written, str) and written in SAME_ATTENTION:
        kept["attn_implementation"] = SAME_ATTENTION[written]
        report.warn("attn_implementation", f"{written} read as {SAME_ATTENTION[written]}, the same exact attention")
    return kept


def _cut_cross_entropy(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``cut_cross_entropy``: the loss computed without the full logits, which
    ``fused_linear_cross_entropy`` (ktrain-plugin-fused-loss) does; an unset one of those is set to match."""
    if value is False:
        report.warn("cut_cross_entropy", "accepted as off")
    elif value is not True:
        report.error("cut_cross_entropy", f"expected true or false, got {value!r}")
    elif kept.get("fused_linear_cross_entropy") is None:
        kept["fused_linear_cross_entropy"] = True
        report.warn("cut_cross_entropy", "read as fused_linear_cross_entropy: true (ktrain-plugin-fused-loss)")


def _reinit_weights(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``reinit_weights``: the model built from its config with random weights, as
    ``random_init_weights`` does."""
    if value is False:
        report.warn("reinit_weights", "accepted as off")
    elif value is not True:
        report.error("reinit_weights", f"expected true or false, got {value!r}")
    else:
        kept["random_init_weights"] = True
        report.warn("reinit_weights", "read as random_init_weights: true (the model's config with random weights)")


def _linearized_experts(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``llama4_linearized_experts``: Llama 4's fused expert weights rewritten as one linear layer per
    expert, the same computation in another layout, which ``load_in_4bit`` then quantizes and LoRA can target.
    Where no LoRA reaches the experts, the same parameters train with the fused experts kept (unquantized);
    where it does (``lora_target_linear`` or an ``experts`` target), it is refused."""
    key = "llama4_linearized_experts"
    targets = kept.get("lora_target_modules") or []
    targets = [targets] if isinstance(targets, str) else targets
    if value is False:
        report.warn(key, "accepted as off")
    elif value is not True:
        report.error(key, f"expected true or false, got {value!r}")
    elif kept.get("adapter") and (kept.get("lora_target_linear") is True or any("experts" in str(t) for t in targets)):
        report.error(
            key,
            "puts LoRA on each expert's linear layer (lora_target_linear or an experts target), which ktrain's fused "
            "experts do not have; put LoRA on them with lora_target_parameters, or leave this out",
        )
    else:
        report.warn(
            key,
            "accepted: the experts stay fused and in the checkpoint's precision, the same parameters train (no LoRA "
            "targets them); they take 2 to 4 times the memory of Axolotl's quantized per-expert layers",
        )


def _dpo_beta(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's former spelling of ``rl_beta``, read as it where ``rl_beta`` is not written (as Axolotl does)."""
    if kept.get("rl_beta") is None:
        kept["rl_beta"] = value
        report.warn("dpo_beta", "read as rl_beta (Axolotl's former spelling)")
    else:
        report.warn("dpo_beta", "not used: rl_beta is written, and Axolotl reads it first")


def _gemma4_hybrid_attention(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``gemma4_hybrid_attn_impl``: flash attention for Gemma 4's sliding-window layers and SDPA for
    its global layers, whose head_dim of 512 flash attention cannot serve. Both are exact attention, so every
    layer on SDPA computes the same."""
    key = "gemma4_hybrid_attn_impl"
    if value is False:
        report.warn(key, "accepted as off")
    elif value is not True:
        report.error(key, f"expected true or false, got {value!r}")
    elif kept.get("attn_implementation") == "flash_attention_2":
        kept["attn_implementation"] = "sdpa"
        report.warn(
            key,
            "read as attn_implementation: sdpa on every layer, the same exact attention "
            "(flash attention cannot serve Gemma 4's global layers, head_dim 512)",
        )
    else:
        report.warn(key, "accepted: every layer uses attn_implementation, the same exact attention")


def _eta_min(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """``eta_min`` (the floor of torch's ``CosineAnnealingLR``) written at the top level, as some Axolotl configs
    do: it is no Axolotl key, and Axolotl's schema drops keys it does not define, so the learning rate decays as
    ``lr_scheduler`` alone says (to 0 for cosine); ktrain trains the same, and says how to get the floor."""
    floor, lr = _number(value), _number(kept.get("learning_rate"))
    if floor is None or floor < 0:
        report.error("eta_min", f"expected a non-negative number, got {value!r}")
        return
    ratio = f"cosine_min_lr_ratio: {floor / lr:.4g}" if lr else "cosine_min_lr_ratio (the floor over learning_rate)"
    report.warn(
        "eta_min",
        f"accepted, no effect (as in Axolotl, whose schema drops it); for a floor of {value} write {ratio}",
    )


def _mistral_common(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``tokenizer_use_mistral_common``: the tokenizer of the mistral-common library, with which
    Axolotl encodes chats. ktrain cannot use it (transformers' ``MistralCommonBackend`` renders no chat template
    and gives no token offsets, which chat masking needs), so true is read as the folder's Hugging Face tokenizer
    (``tokenizer.json``) and chat template, which most of Mistral's repositories ship beside ``tekken.json``; a local
    folder without ``tokenizer.json`` is refused."""
    key = "tokenizer_use_mistral_common"
    source = kept.get("tokenizer_config") or kept.get("base_model")
    if value is False:
        report.warn(key, "accepted as off")
    elif value is not True:
        report.error(key, f"expected true or false, got {value!r}")
    elif isinstance(source, str) and Path(source).is_dir() and not (Path(source) / "tokenizer.json").exists():
        report.error(
            key,
            f"{source} has no tokenizer.json, and ktrain cannot use mistral-common's tokenizer (it renders no chat "
            "template and gives no token offsets); give a tokenizer_config folder with tokenizer.json",
        )
    else:
        report.warn(
            key,
            "read as the folder's Hugging Face tokenizer (tokenizer.json) and its chat template: ktrain cannot use "
            "mistral-common's tokenizer (no chat template, no token offsets); where the template renders a chat "
            "otherwise than mistral-common encodes it, the tokens differ from Axolotl's",
        )


def _quantization_kwargs(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``model_quantization_config_kwargs``: kept for ``_quantization``, which reads it with the class
    it configures (a mapping without the class is refused there)."""
    kept[QUANTIZATION_KWARGS] = value


def _quantization(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``model_quantization_config``: a transformers quantization config class, built with
    ``model_quantization_config_kwargs`` and given to ``from_pretrained``. ``Mxfp4Config`` with ``dequantize: true``
    (gpt-oss's MXFP4 checkpoints read as bf16 weights that train in full) is read as ``model_config``'s
    ``quantization_config``, which ktrain's loader gives transformers the same way; any other is refused."""
    kwargs = kept.pop(QUANTIZATION_KWARGS, None) or {}
    others = "ktrain-plugin-lora loads 4-bit and 8-bit bitsandbytes weights (load_in_4bit, load_in_8bit)"
    if value != "Mxfp4Config":
        report.error("model_quantization_config", f"{value!r} is not supported; {others}")
    elif kwargs != {"dequantize": True}:
        report.error(
            "model_quantization_config_kwargs",
            "training on MXFP4 weights is not supported; write {dequantize: true} to train them dequantized to bf16",
        )
    else:
        wanted = {"quant_method": "mxfp4", "dequantize": True}
        kept["model_config"] = {**(kept.get("model_config") or {}), "quantization_config": wanted}
        report.warn(
            "model_quantization_config",
            "read as model_config: {quantization_config: {quant_method: mxfp4, dequantize: true}}: "
            "transformers dequantizes the MXFP4 weights to bf16 on load, and they train in full",
        )


def _best_metric(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``metric_for_best_model``: the metric checkpoints are ranked by. ktrain ranks them by the eval
    loss (``early_stopping_patience``, ``load_best_model_at_end``), so that one is accepted, any other refused."""
    if value in ("eval_loss", "loss"):
        report.warn("metric_for_best_model", "accepted: checkpoints are ranked by eval_loss, the lower the better")
    else:
        report.error("metric_for_best_model", f"{value!r} is not supported; checkpoints are ranked by eval_loss")


def _greater_is_better(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``greater_is_better``: false is how the eval loss ranks (accepted); true is refused."""
    if value is False:
        report.warn("greater_is_better", "accepted: a lower eval_loss is better")
    else:
        report.error("greater_is_better", "only false is supported: checkpoints are ranked by eval_loss, lower first")


def _number(value: Any) -> float | None:
    """A YAML number, or a string YAML 1.1 leaves unparsed (``5e-6``), as a float; None for anything else."""
    if isinstance(value, bool):
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


def _foreign_dataset_types(kept: dict[Any, Any], report: Report) -> None:
    """Dataset types of Axolotl's trainers that ktrain does not have (``FOREIGN_TYPES``, by prefix) refused with
    what they are, in place of the "no dataset format" error (the type is taken out of the refused config)."""
    for key in NESTED:
        items = kept.get(key)
        for i, item in enumerate(items if isinstance(items, list) else []):
            written = item.get("type") if isinstance(item, dict) else None
            reason = next((r for p, r in FOREIGN_TYPES.items() if str(written).startswith(p)), None)
            if isinstance(written, str) and reason is not None:
                report.error(f"{key}[{i}].type", f"{written!r} is not supported: {reason}")
                item["type"] = None


def _processor_datasets(kept: dict[Any, Any]) -> None:
    """``type: chat_template`` datasets read as ``PROCESSOR_FORMAT`` when ``processor_type`` is written."""
    if kept.get("processor_type") is None:
        return
    for key in ("datasets", "test_datasets"):
        items = kept.get(key)
        for item in items if isinstance(items, list) else []:
            if isinstance(item, dict) and item.get("type") == "chat_template":
                item["type"] = PROCESSOR_FORMAT


def _checkpointing_once(kept: dict[Any, Any], report: Report) -> None:
    """``gradient_checkpointing: true`` beside ``fsdp_config.activation_checkpointing: true``, as Axolotl's FSDP
    configs write them: both recompute each block in backward, so FSDP's alone is kept (the same gradients,
    each block recomputed once)."""
    fsdp = kept.get("fsdp_config")
    if kept.get("gradient_checkpointing") is not True or not isinstance(fsdp, dict):
        return
    if fsdp.get("activation_checkpointing") is True or fsdp.get("fsdp_activation_checkpointing") is True:
        kept["gradient_checkpointing"] = False
        report.warn(
            "gradient_checkpointing",
            "read as false: fsdp_config.activation_checkpointing recomputes each block already (once, not twice)",
        )


def _older_spellings(kept: dict[Any, Any], report: Report) -> None:
    """Values of owned keys in a form Axolotl's older configs and transformers use: ``tokens`` as a mapping
    (Axolotl's former spelling of ``special_tokens``), and ``warmup_steps`` below 1 (transformers reads it as
    a share of the steps, ``warmup_ratio``)."""
    tokens = kept.get("tokens")
    if isinstance(tokens, dict) and kept.get("special_tokens") is None:
        kept["special_tokens"] = kept.pop("tokens")
        report.warn("tokens", "a mapping is read as special_tokens (Axolotl's former spelling)")
    warmup = kept.get("warmup_steps")
    if isinstance(warmup, float) and 0 < warmup < 1 and kept.get("warmup_ratio") is None:
        kept["warmup_ratio"] = kept.pop("warmup_steps")
        report.warn("warmup_steps", f"read as warmup_ratio: {warmup} (transformers reads below 1 as a share of steps)")


def _activation_offloading(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``activation_offloading`` beside ``gradient_checkpointing: true``: what is saved for backward
    is then each block's input, which ``gradient_checkpointing: offload`` holds in host memory."""
    key = "activation_offloading"
    if value is False:
        report.warn(key, "accepted as off")
    elif value not in (True, "legacy"):
        report.error(key, f"{value!r} is not supported; true (with gradient_checkpointing: true) is")
    elif kept.get("gradient_checkpointing") not in (True, "offload"):
        report.error(key, "needs gradient_checkpointing: true; or write gradient_checkpointing: offload alone")
    else:
        kept["gradient_checkpointing"] = "offload"
        report.warn(key, "read as gradient_checkpointing: offload (each block's saved input in host memory)")


def _batch_size(value: Any, kept: dict[Any, Any], report: Report) -> None:
    """Axolotl's ``batch_size``: rows per rank per optimizer step, so ``gradient_accumulation_steps`` is
    ``batch_size // micro_batch_size`` unless written; when written, ``batch_size`` is not used."""
    micro = kept.get("micro_batch_size", 1)
    if not isinstance(value, int) or isinstance(value, bool) or not isinstance(micro, int) or value < 1:
        report.error("batch_size", f"expected a positive integer (rows per rank per optimizer step), got {value!r}")
    elif kept.get("gradient_accumulation_steps") is not None:
        report.warn("batch_size", "not used: gradient_accumulation_steps is written, and with micro_batch_size sets it")
    elif value < micro:
        report.error("batch_size", f"is smaller than micro_batch_size ({micro}); write gradient_accumulation_steps")
    else:
        kept["gradient_accumulation_steps"] = value // micro
        report.warn(
            "batch_size", f"read as gradient_accumulation_steps: {value // micro} (batch_size // micro_batch_size)"
        )


def _sift_inside(name: str, value: Any, section: type, report: Report) -> Any:
    """The value of an owned key with the catalogued keys its class does not declare taken out."""
    try:
        hint = typing.get_type_hints(section).get(name)
    except Exception:  # a plugin's annotation that does not resolve: its keys are left to the converter
        return value
    inner = _attrs_class(hint)
    if inner is None:
        return value
    owned = {f.name for f in attrs.fields(inner)}
    if name in NESTED and isinstance(value, list):
        return [
            _sift_mapping(item, f"{name}[{i}]", NESTED[name], owned, report) if isinstance(item, dict) else item
            for i, item in enumerate(value)
        ]
    if name in NESTED_MAPPINGS and isinstance(value, dict):
        return _sift_mapping(value, name, name, owned, report)
    return value


def _sift_mapping(item: dict[Any, Any], path: str, prefix: str, owned: set[str], report: Report) -> dict[Any, Any]:
    kept: dict[Any, Any] = {}
    for key, value in item.items():
        verdict = classify(f"{prefix}.{key}") if isinstance(key, str) and key not in owned else None
        if verdict is None or value is None:
            kept[key] = value
        else:
            _judge(f"{path}.{key}", value, verdict, report)
    return kept


def _attrs_class(hint: Any) -> type | None:
    """The attrs class a field holds: itself, in a list, or in a union with None."""
    if attrs.has(hint):
        return hint
    for arg in typing.get_args(hint):
        found = _attrs_class(arg)
        if found is not None:
            return found
    return None


def _is_off(value: Any) -> bool:
    """False, or an empty string, list or mapping (a mapping of nulls included): the feature switched off."""
    if isinstance(value, dict):
        return all(v is None for v in value.values())
    return value is False or (isinstance(value, (str, list)) and not value)


def _judge(path: str, value: Any, verdict: tuple[str, str], report: Report) -> None:
    kind, reason = verdict
    if kind == "accepted":
        report.warn(path, f"accepted, no effect in ktrain: {reason}")
    elif _is_off(value):
        report.warn(path, f"accepted as off: not supported by ktrain ({reason})")
    else:
        report.error(path, f"not supported: {reason}")


def check_plugins(value: Any, report: Report, installed: set[str]) -> None:
    """``plugins:``: Axolotl integration paths and ktrain distribution names. An integration whose job a
    ktrain plugin does is named with that plugin (refused with the install command when it is not
    installed); one that only makes keys available (``ACCEPTED_INTEGRATIONS``) is accepted with a note; one
    with no ktrain equivalent is refused by name; so is a ktrain plugin not installed."""
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        report.error("plugins", "expected a list of Axolotl integration paths or ktrain plugin distribution names")
        return
    for i, entry in enumerate(value):
        path = f"plugins[{i}]"
        if entry.startswith(INTEGRATION_PREFIX):
            module = entry.removeprefix(INTEGRATION_PREFIX).split(".")[0]
            if module in ACCEPTED_INTEGRATIONS:
                report.warn(path, f"{entry}: accepted, no effect in ktrain: {ACCEPTED_INTEGRATIONS[module]}")
                continue
            dist, what = INTEGRATIONS.get(module, (None, f"the Axolotl integration '{module}'"))
            if dist is None:
                report.error(path, f"{entry}: {what} has no ktrain equivalent; leave it out")
            elif dist in installed:
                report.warn(path, f"{entry}: {dist} does this job in ktrain (installed); its keys switch it on")
            else:
                report.error(path, f"{entry}: {dist} does this job in ktrain, not installed: `{install_command(dist)}`")
        elif entry in installed:
            report.warn(path, f"{entry}: installed; ktrain finds installed plugins itself, their keys switch them on")
        elif entry in PLUGIN_KEYS:
            report.error(path, f"{entry}: not installed: `{install_command(entry)}`")
        else:
            report.error(
                path,
                f"{entry}: neither an Axolotl integration ({INTEGRATION_PREFIX}...) nor a ktrain plugin; "
                "`ktrain plugins` lists those installed",
            )


# Owned by the kernel and read by this module (no section declares them): Axolotl keys that this module translates
# into ktrain keys, or accepts or refuses by the rest of the config, each with a note, once every key is read.
TRANSLATED = {
    "activation_offloading": _activation_offloading,
    "batch_size": _batch_size,
    "cut_cross_entropy": _cut_cross_entropy,
    "reinit_weights": _reinit_weights,
    "gemma4_hybrid_attn_impl": _gemma4_hybrid_attention,
    "llama4_linearized_experts": _linearized_experts,
    "dpo_beta": _dpo_beta,
    "eta_min": _eta_min,
    "tokenizer_use_mistral_common": _mistral_common,
    "model_quantization_config_kwargs": _quantization_kwargs,  # before the class it configures
    "model_quantization_config": _quantization,
    "metric_for_best_model": _best_metric,
    "greater_is_better": _greater_is_better,
}
HANDLED_HERE = ("plugins", *TRANSLATED)
"""The top-level keys this module owns: ``plugins:`` and those of ``TRANSLATED``."""
