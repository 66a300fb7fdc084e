"""Default owner of ``model_loader`` and ``export``: Hugging Face transformers models and tokenizers.

A local folder or a hub id; with ``random_init_weights`` the model is built from its config with
random weights (tests, benchmarks). Weights load in fp32 (the master copy; bf16 under ``bfloat16``);
autocast computes in bf16/fp16. ``flash_attention_2`` falls back to PyTorch SDPA, with a warning, where
flash-attn is not installed.
"""

from __future__ import annotations

import importlib.util
import inspect
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

from ktrain import hookimpl
from ktrain.config.report import ConfigError
from ktrain.run.context import weight_dtype

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)


def attention_implementation(config: Any) -> str:
    """The attention implementation the config asks for, after the fallbacks this machine needs."""
    wanted = config.attn_implementation or (
        "flash_attention_2" if config.flash_attention else "flex_attention" if config.flex_attention else "sdpa"
    )
    if wanted == "flash_attention_2" and (
        importlib.util.find_spec("flash_attn") is None or not torch.cuda.is_available()
    ):
        warnings.warn(
            "flash_attention: flash-attn is not installed (or there is no GPU); using PyTorch SDPA attention instead",
            stacklevel=1,
        )
        return "sdpa"
    if wanted == "flex_attention" and not torch.cuda.is_available():
        warnings.warn(
            "attn_implementation: FlexAttention has no backward pass on a CPU; using PyTorch SDPA attention instead",
            stacklevel=1,
        )
        return "sdpa"
    return wanted


def add_tokens(tokenizer: Any, config: Any) -> None:
    """Set ``special_tokens`` on ``tokenizer`` and add ``tokens`` to it (each only where new).

    A ``model_loader`` plugin that loads its own tokenizer calls this, and ``fit_embeddings`` on its model.
    """
    if config.special_tokens:
        tokenizer.add_special_tokens(dict(config.special_tokens))
    if config.tokens:
        tokenizer.add_tokens(list(config.tokens))


def fit_embeddings(model: Any, vocab: int) -> None:
    """Grow the model's input and output embeddings to ``vocab`` rows when the tokenizer outgrew them.

    New rows start at the mean of the old ones (transformers' ``mean_resizing``), or at the model's own
    initialisation on the meta device, where the weights arrive later from rank 0.
    """
    if vocab > model.get_input_embeddings().num_embeddings:
        on_meta = model.get_input_embeddings().weight.is_meta
        model.resize_token_embeddings(vocab, mean_resizing=not on_meta)


def enable_gradient_checkpointing(model: Any, config: Any) -> None:
    """Recompute the model's blocks in backward as ``gradient_checkpointing`` asks (nothing when false).

    ``offload`` also keeps each block's saved input in pinned host memory until backward
    (transformers' ``activation_checkpointing_enable(offload=True)``); a transformers without that option
    recomputes without offload, and says so. Without a GPU the activations are in host memory already:
    ``offload`` is ``true`` there (transformers' offload would ask for pinned memory, which needs one).
    """
    if not config.gradient_checkpointing:
        return
    kwargs = config.gradient_checkpointing_kwargs or {"use_reentrant": False}
    offload = config.gradient_checkpointing == "offload" and torch.cuda.is_available()
    enable = getattr(model, "activation_checkpointing_enable", None)
    if enable is not None and "offload" in inspect.signature(enable).parameters:
        enable(activation_checkpointing_kwargs=kwargs, offload=offload)
        return
    if offload:
        warnings.warn(
            "gradient_checkpointing: offload needs a transformers whose activation_checkpointing_enable takes "
            f"offload (5.24 does; this is {transformers.__version__}): the blocks are recomputed, their inputs "
            "stay on the device",
            stacklevel=1,
        )
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def placement(kwargs: dict[str, Any], run: Any) -> dict[str, Any]:
    """``device_map`` onto the run's GPU for a quantized model: bitsandbytes quantizes each weight where it is
    placed, much faster on a GPU than on the host. None on a CPU, and none under DeepSpeed ZeRO-3, which
    places the weights itself (transformers refuses a ``device_map`` there)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if "quantization_config" not in kwargs or run.device.type != "cuda" or is_deepspeed_zero3_enabled():
        return {}
    return {"device_map": {"": run.device}}


class HFModel:
    """Loads the tokenizer and model of ``base_model`` and exports the trained model as safetensors."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_load_tokenizer(self, run: Any) -> Any:
        cfg = self.config
        source = cfg.tokenizer_config or cfg.base_model
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(source, trust_remote_code=cfg.trust_remote_code)
        except OSError as e:
            key = "tokenizer_config" if cfg.tokenizer_config else "base_model"
            raise ConfigError.single(key, f"cannot load a tokenizer from {source}: {e}") from None
        add_tokens(tokenizer, cfg)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    @hookimpl(trylast=True)
    def ktrain_load_model(self, run: Any, model_kwargs: dict[str, Any]) -> Any:
        cfg = self.config
        auto = getattr(transformers, cfg.model_type or "AutoModelForCausalLM")
        kwargs = {"attn_implementation": attention_implementation(cfg), "dtype": weight_dtype(cfg), **model_kwargs}
        if cfg.random_init_weights:
            model_config = transformers.AutoConfig.from_pretrained(
                cfg.base_model_config or cfg.base_model, trust_remote_code=cfg.trust_remote_code
            )
            dense = {k: v for k, v in kwargs.items() if k != "quantization_config"}
            model = auto.from_config(model_config, trust_remote_code=cfg.trust_remote_code, **dense)
            if "quantization_config" in kwargs:  # quantized as from_pretrained quantizes weights read from disk
                model = type(model).from_pretrained(
                    None, config=model.config, state_dict=model.state_dict(), **kwargs, **placement(kwargs, run)
                )
        else:
            local = Path(cfg.base_model)
            if local.is_dir() and not any((local / name).exists() for name in WEIGHT_FILES):
                raise FileNotFoundError(
                    f"base_model: {local} has no weights ({', '.join(WEIGHT_FILES[::2])}); "
                    f"set random_init_weights: true to train from random weights"
                )
            try:
                model = auto.from_pretrained(
                    cfg.base_model, trust_remote_code=cfg.trust_remote_code, **kwargs, **placement(kwargs, run)
                )
            except OSError as e:
                raise ConfigError.single(
                    "base_model",
                    f"cannot load {cfg.base_model}: {e}. Give a local model folder, or a hub id "
                    "with the network (or the hub cache) available.",
                ) from None
        model.config.use_cache = False
        if cfg.special_tokens or cfg.tokens:
            fit_embeddings(model, len(run.tokenizer or self.ktrain_load_tokenizer(run=run)))
        enable_gradient_checkpointing(model, cfg)
        return model

    @hookimpl(trylast=True)
    def ktrain_export_model(self, engine: Any, run: Any, path: Path) -> bool:
        state = engine.full_state_dict()
        if run.is_main:
            model = engine.model
            model.save_pretrained(path, state_dict=state, safe_serialization=True)
            run.tokenizer.save_pretrained(path)
        return True
