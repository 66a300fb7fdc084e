"""The peft adapter: its ``LoraConfig`` from the keys, attaching it to the base, and saving it.

The base is frozen in whatever dtype it was loaded in (4-bit or 8-bit weights stay quantized); the
adapter's own weights, and modules trained in full (``lora_modules_to_save``), train in fp32, or in the
base's bf16 where ``adamw_fp32_master`` keeps their fp32 masters in the optimizer (``trained_dtype``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import peft
import torch

from ktrain.config.report import ConfigError
from ktrain_lora.fused_forward import install
from ktrain_lora.keys import bf16_masters, quantization_bits
from ktrain_lora.quantization import keep_training_layout


def _linear_names(model: torch.nn.Module) -> set[str]:
    """Last name parts of every linear layer except the output layer (bitsandbytes' 4-bit and 8-bit layers
    are ``torch.nn.Linear`` too)."""
    output = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    linear = torch.nn.Linear
    return {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if isinstance(m, linear) and m is not output}


def target_modules(model: torch.nn.Module, config: Any) -> list[str] | str | None:
    """``lora_target_linear`` (every linear layer) together with ``lora_target_modules``; None: peft's default."""
    named = config.lora_target_modules
    if not config.lora_target_linear:
        return named
    if named is None:
        return "all-linear"
    if isinstance(named, str):
        raise ConfigError.single(
            "lora_target_modules", "is a regex, which cannot be joined with lora_target_linear: true; give a list"
        )
    return sorted(_linear_names(model) | set(named))


def lora_config(model: torch.nn.Module, config: Any) -> peft.LoraConfig:
    """The ``LoraConfig`` the keys describe."""
    return peft.LoraConfig(
        task_type="CAUSAL_LM",
        r=config.lora_r,
        lora_alpha=config.lora_alpha,
        lora_dropout=config.lora_dropout,
        target_modules=target_modules(model, config),
        target_parameters=config.lora_target_parameters,
        modules_to_save=config.lora_modules_to_save,
        use_dora=config.peft_use_dora,
        use_rslora=config.peft_use_rslora,
    )


def _plain_parameters(model: torch.nn.Module) -> list[str]:
    """Last two name parts of the matrices held outside linear and embedding layers (what target_parameters
    is for), e.g. ``experts.gate_up_proj``."""
    layers = (torch.nn.Linear, torch.nn.Embedding)
    found = {
        ".".join(f"{module}.{name}".rsplit(".", 2)[-2:])
        for module, m in model.named_modules()
        if not isinstance(m, layers)
        for name, p in m.named_parameters(recurse=False)
        if p.dim() >= 2
    }
    return sorted(found)


def _check_target_parameters(model: torch.nn.Module, config: Any) -> None:
    """Every name in ``lora_target_parameters`` ends the name of a parameter (peft only warns when none does)."""
    names = [name for name, _ in model.named_parameters()]
    for wanted in config.lora_target_parameters or ():
        if not any(name == wanted or name.endswith(f".{wanted}") for name in names):
            plain = ", ".join(_plain_parameters(model)) or "none"
            raise ConfigError.single(
                "lora_target_parameters",
                f"{wanted!r} ends the name of no parameter of this model; its matrices outside linear layers: {plain}",
            )


def _target_key(config: Any) -> str:
    if config.is_set("lora_target_modules"):
        return "lora_target_modules"
    return "lora_target_linear" if config.lora_target_linear else "adapter"


def trained_dtype(config: Any) -> torch.dtype:
    """The dtype the adapter's weights train in: bf16 with fp32 masters in the optimizer (``bf16_masters``), so
    the forward and backward cast none of them; fp32 otherwise."""
    return torch.bfloat16 if bf16_masters(config) else torch.float32


def attach(model: torch.nn.Module, config: Any, dtype: torch.dtype = torch.float32) -> peft.PeftModel:
    """Freeze ``model`` and wrap it in the adapter, its weights in ``dtype``; a wrong module name is a
    ``ConfigError`` naming its key."""
    if quantization_bits(config) == 4:
        keep_training_layout(model)
    if config.lora_model_dir:
        wrapped = peft.PeftModel.from_pretrained(model, config.lora_model_dir, is_trainable=True)
    else:
        _check_target_parameters(model, config)
        try:
            wrapped = peft.get_peft_model(model, lora_config(model, config))
        except ValueError as e:
            raise ConfigError.single(
                _target_key(config),
                f"{e} Modules of this model: {', '.join(sorted(_linear_names(model)))} "
                "(or set lora_target_linear: true)",
            ) from None
    for param in wrapped.parameters():
        if param.requires_grad and param.dtype != dtype:
            param.data = param.data.to(dtype)
    if config.lora_fused_forward:
        install(wrapped)
    return wrapped


def adapter_names(model: peft.PeftModel) -> set[str]:
    """Names (in ``model.state_dict()``) of the tensors that make up the adapter: the trained ones."""
    return {name for name, p in model.named_parameters() if p.requires_grad}


def save_adapter(model: peft.PeftModel, state: dict[str, torch.Tensor], path: Path, base_model: str) -> None:
    """Write the adapter part of ``state`` (the whole model's state, gathered) as peft's adapter folder.

    ``adapter_config.json`` names ``base_model``; embedding layers are saved only when trained
    (``lora_modules_to_save``), so peft never looks the base up on the hub to guess.
    """
    for adapter in model.peft_config.values():
        adapter.base_model_name_or_path = base_model
    model.save_pretrained(path, state_dict=state, safe_serialization=True, save_embedding_layers=False)
