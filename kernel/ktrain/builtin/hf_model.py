"""Default owner of ``model_loader`` and ``export``: Hugging Face transformers models and tokenizers.

A local folder or a hub id; with ``random_init_weights`` the model is built from its config with
random weights (tests, benchmarks). Weights load in fp32 (the master copy; bf16 under ``bfloat16``);
autocast computes in bf16/fp16. ``flash_attention_2`` falls back to PyTorch SDPA, with a warning, where
flash-attn is not installed.

``build_model`` builds (``empty``: on the meta device, for a loader whose weights come from another rank)
and ``finish_model`` readies the model; a ``model_loader`` plugin calls them rather than copying them.
"""

from __future__ import annotations

import importlib.util
import warnings
from pathlib import Path
from typing import Any

import torch
import transformers

from ktrain import hookimpl
from ktrain.builtin.checkpointing import Recompute, apply_checkpointing
from ktrain.builtin.freezing import freeze_except
from ktrain.config.fast_defaults import attention
from ktrain.config.report import ConfigError
from ktrain.run.context import weight_dtype

WEIGHT_FILES = (
    "model.safetensors",
    "model.safetensors.index.json",
    "pytorch_model.bin",
    "pytorch_model.bin.index.json",
)

# transformers 5 picks mistral-common's tokenizer itself where mistral-common is installed and the folder has
# tekken.json; it renders no chat template and gives no token offsets, which the data needs: tokenizer.json is taken.
NO_MISTRAL_FORMAT = {"mistral_format": False} if int(transformers.__version__.split(".")[0]) >= 5 else {}


def attention_implementation(config: Any) -> str:
    """The attention implementation the config asks for, after the fallbacks this machine needs."""
    wanted = attention(config)
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


def placement(kwargs: dict[str, Any], run: Any) -> dict[str, Any]:
    """``device_map`` onto the run's GPU for a quantized model: bitsandbytes quantizes each weight where it is
    placed, much faster on a GPU than on the host. None on a CPU, and none under DeepSpeed ZeRO-3, which
    places the weights itself (transformers refuses a ``device_map`` there)."""
    from transformers.integrations import is_deepspeed_zero3_enabled

    if "quantization_config" not in kwargs or run.device.type != "cuda" or is_deepspeed_zero3_enabled():
        return {}
    return {"device_map": {"": run.device}}


def load_kwargs(config: Any, model_kwargs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments the model is built with: the attention implementation and the weight dtype,
    then ``model_kwargs`` over them (a QLoRA base asks for its compute dtype)."""
    return {"attn_implementation": attention_implementation(config), "dtype": weight_dtype(config), **model_kwargs}


def revision(config: Any) -> dict[str, Any]:
    """``revision=`` for loading the hub-id ``base_model`` at ``revision_of_model``; nothing when unset."""
    return {"revision": config.revision_of_model} if config.revision_of_model else {}


def config_overrides(config: Any) -> dict[str, Any]:
    """``model_config``: settings of the model's config to change before it is built. A name the model's
    config does not have stops the run naming it (a typo would otherwise be stored and never read). A
    ``quantization_config`` mapping (as config.json writes it) becomes the transformers class it names, the form
    ``from_pretrained`` takes to load a quantized checkpoint another way (MXFP4 with ``dequantize: true``)."""
    overrides = dict(config.model_config or {})
    if overrides:
        source = config.base_model_config or config.base_model
        known = transformers.AutoConfig.from_pretrained(
            source, trust_remote_code=config.trust_remote_code, **({} if config.base_model_config else revision(config))
        )
        unknown = [name for name in overrides if name not in known.to_dict()]
        if unknown:
            raise ConfigError.single(
                f"model_config.{unknown[0]}", f"the model's config ({type(known).__name__}) has no such setting"
            )
    if isinstance(overrides.get("quantization_config"), dict):
        from transformers.quantizers import AutoQuantizationConfig  # transformers' every quantizer: imported when used

        overrides["quantization_config"] = AutoQuantizationConfig.from_dict(overrides["quantization_config"])
    return overrides


def build_model(config: Any, run: Any, model_kwargs: dict[str, Any], *, empty: bool = False) -> Any:
    """Build the model of ``config``: its weights read from ``base_model`` (a folder or a hub id), or random
    with ``random_init_weights``; in the weight dtype, with the attention implementation this machine
    allows and ``model_kwargs`` (``ktrain_collect_model_kwargs``: a ``quantization_config`` quantizes it).

    ``empty``: build the same architecture on the meta device, no weights read, nothing quantized (the
    ``quantization_config`` is left out: a caller that needs a quantized skeleton makes it), for a loader
    whose weights arrive later, from another rank (FSDP's ``cpu_ram_efficient_loading``). Then
    ``finish_model``. ``model_config`` changes the model's config first (``config_overrides``).
    """
    auto = getattr(transformers, config.model_type or "AutoModelForCausalLM")
    kwargs = load_kwargs(config, model_kwargs)
    dense = {k: v for k, v in kwargs.items() if k != "quantization_config"}
    overrides = config_overrides(config)
    if empty or config.random_init_weights:
        model_config = transformers.AutoConfig.from_pretrained(
            config.base_model_config or config.base_model,
            trust_remote_code=config.trust_remote_code,
            **revision(config),
            **overrides,
        )
        if empty:
            with torch.device("meta"):
                return auto.from_config(model_config, trust_remote_code=config.trust_remote_code, **dense)
        model = auto.from_config(model_config, trust_remote_code=config.trust_remote_code, **dense)
        if "quantization_config" in kwargs:  # quantized as from_pretrained quantizes weights read from disk
            model = type(model).from_pretrained(
                None, config=model.config, state_dict=model.state_dict(), **kwargs, **placement(kwargs, run)
            )
        return model
    local = Path(config.base_model)
    if local.is_dir() and not any((local / name).exists() for name in WEIGHT_FILES):
        raise FileNotFoundError(
            f"base_model: {local} has no weights ({', '.join(WEIGHT_FILES[::2])}); "
            f"set random_init_weights: true to train from random weights"
        )
    try:
        return auto.from_pretrained(
            config.base_model,
            trust_remote_code=config.trust_remote_code,
            **revision(config),
            **overrides,
            **kwargs,
            **placement(kwargs, run),
        )
    except OSError as e:
        raise ConfigError.single(
            "base_model",
            f"cannot load {config.base_model}: {e}. Give a local model folder, or a hub id "
            "with the network (or the hub cache) available.",
        ) from None


def finish_model(model: Any, config: Any, run: Any) -> Any:
    """Ready a built model for training: no KV cache, the embeddings grown to the tokenizer's length where
    ``special_tokens`` or ``tokens`` are set (to a multiple of 32 with ``resize_token_embeddings_to_32x``),
    only ``unfrozen_parameters`` trainable where given (``ktrain.builtin.freezing``), the blocks recomputed
    as ``gradient_checkpointing`` asks (``ktrain.builtin.checkpointing``). Returns ``model``."""
    model.config.use_cache = False
    if config.special_tokens or config.tokens or config.resize_token_embeddings_to_32x:
        vocab = len(run.tokenizer or HFModel(config).ktrain_load_tokenizer(run=run))
        fit_embeddings(model, -(-vocab // 32) * 32 if config.resize_token_embeddings_to_32x else vocab)
    if config.unfrozen_parameters:
        freeze_except(model, config.unfrozen_parameters)
    choice = Recompute.from_config(config)
    if choice is not None:
        apply_checkpointing(model, choice)
    return model


class HFModel:
    """Loads the tokenizer and model of ``base_model`` and exports the trained model as safetensors."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl(trylast=True)
    def ktrain_load_tokenizer(self, run: Any) -> Any:
        cfg = self.config
        source = cfg.tokenizer_config or cfg.base_model
        try:
            tokenizer = transformers.AutoTokenizer.from_pretrained(
                source,
                trust_remote_code=cfg.trust_remote_code,
                **NO_MISTRAL_FORMAT,
                **({} if cfg.tokenizer_config else revision(cfg)),
            )
        except OSError as e:
            key = "tokenizer_config" if cfg.tokenizer_config else "base_model"
            raise ConfigError.single(key, f"cannot load a tokenizer from {source}: {e}") from None
        add_tokens(tokenizer, cfg)
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    @hookimpl(trylast=True)
    def ktrain_load_model(self, run: Any, model_kwargs: dict[str, Any]) -> Any:
        return finish_model(build_model(self.config, run, model_kwargs), self.config, run)

    @hookimpl(trylast=True)
    def ktrain_export_model(self, engine: Any, run: Any, path: Path) -> bool:
        state = engine.full_state_dict()
        if run.is_main:
            model = engine.model
            model.save_pretrained(path, state_dict=state, safe_serialization=True)
            run.tokenizer.save_pretrained(path)
        return True
