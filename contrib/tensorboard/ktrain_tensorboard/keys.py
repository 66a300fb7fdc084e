"""The config key of ktrain-plugin-tensorboard: ``use_tensorboard`` (no torch, no tensorboard here)."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key


@attrs.define(kw_only=True)
class TensorBoardKeys:
    """Metrics for TensorBoard."""

    use_tensorboard: bool = key(False, "also write the logged metrics as TensorBoard events, in output_dir/tensorboard")
