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

    @hookimpl
    def ktrain_load_tokenizer(self, run: Any) -> Any:
        """The kernel's tokenizer loader, unchanged."""
        from ktrain.builtin.hf_model import HFModel  # imports torch: only inside a run

        return HFModel(self.config).ktrain_load_tokenizer(run=run)

    @hookimpl
    def ktrain_load_model(self, run: Any, model_kwargs: dict[str, Any]) -> Any:
        """Rank 0 loads the weights; every other rank builds the same model on the meta device (the kernel's
        ``build_model(empty=True)``), its 4-bit layers as ``quantized_skeleton`` packs them."""
        from ktrain.builtin.hf_model import build_model, finish_model, load_kwargs  # imports torch: inside a run

        quantization = model_kwargs.get("quantization_config")
        four_bit = self.version == 2 and getattr(quantization, "load_in_4bit", False)
        reads = run.rank == 0 or (quantization is not None and not four_bit)
        model = build_model(self.config, run, model_kwargs, empty=not reads)
        if not reads and quantization is not None:
            from ktrain_fsdp.quantized import quantized_skeleton

            model = quantized_skeleton(model, quantization, load_kwargs(self.config, model_kwargs)["dtype"])
        return finish_model(model, self.config, run)
