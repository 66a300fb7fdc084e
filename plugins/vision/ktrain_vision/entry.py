"""Entry module of ktrain-plugin-vision: the vision keys, their checks, and the format of chat rows with images.

Imports nothing heavy: torch and transformers are imported by the format when rows are tokenized and by the
runtime object (``ktrain_vision.runtime``), activated only when ``processor_type`` is written, which loads the
model and the processor and owns the run's objective.
"""

from __future__ import annotations

from typing import Any

import attrs

from ktrain import hookimpl
from ktrain.registry import lazy
from ktrain_vision.checks import validate
from ktrain_vision.keys import VISION_FORMAT, VisionKeys


@hookimpl
def ktrain_register_config(register) -> None:
    register(VisionKeys)


@hookimpl
def ktrain_register_dataset_formats(register) -> None:
    register(VISION_FORMAT, lazy("ktrain_vision.samples:tokenize_vision"))


@hookimpl
def ktrain_validate_config(config: Any, report: Any) -> None:
    """What a vision run cannot be trained with (``ktrain_vision.checks``)."""
    validate(config, report)


@hookimpl
def ktrain_activate(config: Any, activate) -> None:
    """Vision-language training takes part when ``processor_type`` is written: it loads the model and owns the
    objective (the processor's images collated beside the tokens)."""
    if config.processor_type is None:
        return
    keys = tuple(field.name for field in attrs.fields(VisionKeys) if config.is_set(field.name))
    activate("ktrain_vision.runtime:Vision", roles=("model_loader", "objective"), keys=keys)
