"""The config keys of ktrain-plugin-vision (Axolotl's names) and the dataset format it registers: no torch here."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key

# The dataset format of chat rows with images; Axolotl's ``type: chat_template`` is read as it when
# ``processor_type`` is written (Axolotl switches to its multimodal strategy on a processor too).
VISION_FORMAT = "chat_template.vision"
DEFAULT_MODEL_CLASS = "AutoModelForImageTextToText"
RESIZE_ALGORITHMS = ("bilinear", "bicubic", "lanczos", "nearest")
# Parts of a parameter's name that place it in a vision or audio encoder or the projector (Axolotl's list).
MULTIMODAL_MODULES = (
    "vision_tower",
    "vision_model",
    "vision_encoder",
    "embed_vision",
    "multi_modal_projector",
    "visual",
    "audio_tower",
    "audio_model",
    "embed_audio",
)


@attrs.define(kw_only=True)
class VisionKeys:
    """Vision-language models: the processor, and how images are sized before it."""

    processor_type: str | None = key(
        None,
        "transformers processor class that renders and tokenizes chat rows with images (AutoProcessor, or a class "
        "such as LlavaProcessor); switches on vision-language training: the model is loaded with model_type "
        f"(default {DEFAULT_MODEL_CLASS}) and datasets of type chat_template are read with their images",
    )
    image_size: int | None = key(
        None, "resize every image to this many pixels a side before the processor (default: as read)"
    )
    image_resize_algorithm: str | None = key(
        None, f"how image_size resizes: {', '.join(RESIZE_ALGORITHMS)} (default bilinear)"
    )
    freeze_mm_modules: bool = key(
        False,
        "freeze the vision and audio encoders and the multimodal projector (parameters named "
        f"{', '.join(MULTIMODAL_MODULES)}): only the language model trains",
    )
