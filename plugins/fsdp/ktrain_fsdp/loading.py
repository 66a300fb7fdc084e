"""``cpu_ram_efficient_loading``: the weights are read once, by rank 0; the other ranks build the model on meta.

The sharding step then gives every rank its shards from rank 0's copy (FSDP2: a broadcast of the full
state dict; FSDP1: ``sync_module_states``), so host memory holds one copy of the model per machine,
not one per rank. Under FSDP2 a bitsandbytes 4-bit base (QLoRA) is read and quantized by rank 0 alone
too: the other ranks build its 4-bit layers on meta (``ktrain_fsdp.quantized``). Other quantized bases
(and any under FSDP1) load on every rank as usual.
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl


class RamEfficientLoader:
    """Owner of ``model_loader`` under ``cpu_ram_efficient_loading``: the kernel's loader on rank 0 only."""

    def __init__(self, config: Any, version: int):
        self.config = config
        self.version = version

    @property
    def kernel_loader(self) -> Any:
        from ktrain.builtin.hf_model import HFModel  # imports torch: only inside a run

        return HFModel(self.config)

    @hookimpl
    def ktrain_load_tokenizer(self, run: Any) -> Any:
        """The kernel's tokenizer loader, unchanged."""
        return self.kernel_loader.ktrain_load_tokenizer(run=run)

    @hookimpl
    def ktrain_load_model(self, run: Any, model_kwargs: dict[str, Any]) -> Any:
        """Rank 0 loads the weights; every other rank builds the same model on the meta device."""
        quantization = model_kwargs.get("quantization_config")
        four_bit = self.version == 2 and getattr(quantization, "load_in_4bit", False)
        if run.rank == 0 or (quantization is not None and not four_bit):
            return self.kernel_loader.ktrain_load_model(run=run, model_kwargs=model_kwargs)
        import torch
        import transformers

        from ktrain.builtin.hf_model import attention_implementation, enable_gradient_checkpointing, fit_embeddings
        from ktrain.run.context import weight_dtype
        from ktrain_fsdp.quantized import quantized_skeleton

        cfg = self.config
        auto = getattr(transformers, cfg.model_type or "AutoModelForCausalLM")
        model_config = transformers.AutoConfig.from_pretrained(
            cfg.base_model_config or cfg.base_model, trust_remote_code=cfg.trust_remote_code
        )
        kwargs = {"attn_implementation": attention_implementation(cfg), "dtype": weight_dtype(cfg), **model_kwargs}
        kwargs.pop("quantization_config", None)
        with torch.device("meta"):
            model = auto.from_config(model_config, trust_remote_code=cfg.trust_remote_code, **kwargs)
        if quantization is not None:
            model = quantized_skeleton(model, quantization, kwargs["dtype"])
        model.config.use_cache = False
        if cfg.special_tokens or cfg.tokens:
            fit_embeddings(model, len(run.tokenizer or self.ktrain_load_tokenizer(run=run)))
        enable_gradient_checkpointing(model, cfg)
        return model
