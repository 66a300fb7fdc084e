"""The runtime object of an adapter run: quantized loading, the peft adapter, and the adapter export.

Registered by the entry module only when ``adapter`` (or ``qlora: true``) is written. It imports torch
and peft inside its hooks, so that ``ktrain check`` stays light, and bitsandbytes only when the base is
quantized (``ktrain_lora.bitsandbytes_guard``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ktrain import hookimpl
from ktrain_lora.bitsandbytes_guard import hidden_bitsandbytes
from ktrain_lora.keys import quantization_bits


def _weights(param: Any) -> int:
    """How many weights ``param`` holds: a 4-bit parameter packs two per byte of its storage dtype."""
    if type(param).__name__ == "Params4bit":
        return param.numel() * param.element_size() * 2
    return param.numel()


class Lora:
    """Owner of ``export`` in adapter runs; loads the base quantized and wraps it in a peft adapter."""

    def __init__(self, config: Any):
        self.config = config
        self.plain = quantization_bits(config) is None  # a full-precision base: bitsandbytes is kept out

    @hookimpl
    def ktrain_collect_model_kwargs(self, run: Any) -> dict[str, Any] | None:
        """``quantization_config`` for a 4-bit (QLoRA) or 8-bit base; None for plain LoRA."""
        from ktrain_lora.quantization import model_kwargs

        return model_kwargs(self.config, run.compute_dtype)

    @hookimpl
    def ktrain_wrap_model(self, model: Any, run: Any) -> Any:
        """Freeze the base and attach the adapter (new, or continued from ``lora_model_dir``)."""
        with hidden_bitsandbytes(self.plain):
            from ktrain_lora.adapter import attach, trained_dtype

            wrapped = attach(model, self.config, trained_dtype(self.config))
        if run.is_main:
            trainable = sum(p.numel() for p in wrapped.parameters() if p.requires_grad)
            total = sum(_weights(p) for p in wrapped.parameters())
            print(f"adapter: {trainable:,} trainable parameters of {total:,}", flush=True)
        return wrapped

    @hookimpl
    def ktrain_export_model(self, engine: Any, run: Any, path: Path) -> bool:
        """The adapter (peft's adapter_model.safetensors and adapter_config.json) and the tokenizer.

        ``engine.full_state_dict()`` is called on every rank (a sharding engine gathers there); rank 0
        keeps the adapter's tensors and writes them. ``ktrain merge-lora`` turns the folder into a model.
        """
        state = engine.full_state_dict()
        if run.is_main:
            with hidden_bitsandbytes(self.plain):
                from ktrain_lora.adapter import save_adapter

                save_adapter(engine.model, state, path, self.config.base_model)
            run.tokenizer.save_pretrained(path)
        return True
