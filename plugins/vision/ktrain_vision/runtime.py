"""The runtime object of a vision run: the model and the processor's tokenizer loaded, and the objective.

Registered by the entry module only when ``processor_type`` is written; it owns the roles ``model_loader``
(the kernel's Hugging Face loader with the vision class, ``model_type`` or AutoModelForImageTextToText; the
tokenizer is the processor's) and ``objective`` (``ktrain_vision.objective``).
"""

from __future__ import annotations

from typing import Any

from ktrain import hookimpl
from ktrain.builtin.hf_model import build_model, finish_model
from ktrain_vision.keys import DEFAULT_MODEL_CLASS, MULTIMODAL_MODULES


def freeze_multimodal(model: Any) -> int:
    """Stop the gradients of the parameters in the vision and audio encoders and the projector
    (``MULTIMODAL_MODULES``); return how many tensors were trainable before."""
    frozen = 0
    for name, parameter in model.named_parameters():
        if parameter.requires_grad and any(part in MULTIMODAL_MODULES for part in name.split(".")):
            parameter.requires_grad = False
            frozen += 1
    return frozen


class _ModelClass:
    """A config read as it is, but for ``model_type``: the vision class unless the config names one."""

    def __init__(self, config: Any):
        self._config = config
        self.model_type = config.model_type or DEFAULT_MODEL_CLASS

    def __getattr__(self, name: str) -> Any:
        return getattr(self._config, name)


class Vision:
    """Owner of ``model_loader`` and ``objective`` in vision-language runs (``processor_type``)."""

    def __init__(self, config: Any):
        self.config = config

    @hookimpl
    def ktrain_load_tokenizer(self, run: Any) -> Any:
        """The processor's tokenizer (what the kernel pads with and the cache is keyed by)."""
        from ktrain_vision.samples import processor_of

        tokenizer = processor_of(self.config).tokenizer
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
        return tokenizer

    @hookimpl
    def ktrain_load_model(self, run: Any, model_kwargs: dict[str, Any]) -> Any:
        return finish_model(build_model(_ModelClass(self.config), run, model_kwargs), self.config, run)

    @hookimpl(trylast=True)
    def ktrain_wrap_model(self, model: Any, run: Any) -> None:
        """``freeze_mm_modules``: the encoders and the projector frozen, after any adapter is added (as Axolotl)."""
        if not self.config.freeze_mm_modules:
            return
        frozen = freeze_multimodal(model)
        if run.is_main:
            print(f"vision: freeze_mm_modules froze {frozen} parameter tensors", flush=True)

    @hookimpl
    def ktrain_build_objective(self, run: Any, engine: Any) -> Any:
        from ktrain_vision.objective import VisionObjective

        return VisionObjective(self.config)
