"""The checks of a vision config: the processor, the image keys, the datasets' type, and what images cannot be
trained with yet (packing, sharded or model-parallel runs)."""

from __future__ import annotations

from typing import Any

from ktrain_vision.keys import RESIZE_ALGORITHMS, VISION_FORMAT

# Keys (of the kernel or of other plugins) whose runs are not tested with images: (key, what it does).
UNTESTED = (
    ("fsdp_version", "FSDP"),
    ("fsdp_config", "FSDP"),
    ("deepspeed", "DeepSpeed"),
    ("tensor_parallel_size", "tensor parallelism"),
    ("context_parallel_size", "context parallelism"),
    ("sequence_parallel_degree", "sequence parallelism"),
)


def _written(value: Any) -> bool:
    """Whether a key's value asks for something (not None, false, 1 or empty)."""
    return value not in (None, False, 1, "", {}, [])


def validate(config: Any, report: Any) -> None:
    """Refuse what a vision run cannot do, each by its key; datasets of the vision format without a processor."""
    if config.processor_type is None:
        for i, entry in enumerate(config.datasets or []):
            if entry.type == VISION_FORMAT:
                report.error(f"datasets[{i}].type", f"{VISION_FORMAT} holds rows with images: set processor_type")
        for name in ("image_size", "image_resize_algorithm", "freeze_mm_modules"):
            if config.is_set(name) and getattr(config, name):
                report.error(name, "applies with processor_type (vision-language models), which is not written")
        return
    if not config.processor_type.endswith("Processor"):
        report.error("processor_type", f"'{config.processor_type}' is not a transformers processor class")
    if config.image_size is not None and config.image_size <= 0:
        report.error("image_size", "must be above 0")
    if config.image_resize_algorithm is not None and config.image_resize_algorithm not in RESIZE_ALGORITHMS:
        report.error("image_resize_algorithm", f"must be one of {', '.join(RESIZE_ALGORITHMS)}")
    for name in ("chat_template", "chat_template_jinja"):
        if config.is_set(name):
            report.warn(name, "not read with processor_type: the processor's chat template renders rows with images")
    if config.sample_packing:
        report.error("sample_packing", "packing rows with images is not supported; set sample_packing: false")
    for name, what in UNTESTED:
        if _written(getattr(config, name, None)):
            report.error(name, f"{what} with processor_type is not supported yet; train on one process or DDP")
    for i, entry in enumerate(config.datasets or []):
        if entry.type != VISION_FORMAT:
            report.error(
                f"datasets[{i}].type",
                f"'{entry.type}' holds no images; with processor_type the datasets are chat_template rows",
            )
