"""The config key of ktrain-plugin-deepspeed: ``deepspeed`` (no torch, no DeepSpeed here)."""

from __future__ import annotations

from typing import Any

import attrs

from ktrain.config.keys import key


@attrs.define(kw_only=True)
class DeepSpeedKeys:
    """The key that turns DeepSpeed ZeRO on."""

    deepspeed: str | dict[str, Any] | None = key(
        None,
        "DeepSpeed ZeRO: a JSON file, an inline mapping, or a preset (zero1, zero2, zero3, zero3_bf16, "
        'zero3_bf16_cpuoffload_params, zero3_bf16_cpuoffload_all); "auto" values are filled from ktrain\'s keys',
    )
