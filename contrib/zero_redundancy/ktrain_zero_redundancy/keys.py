"""The plugin's config keys: ``zero_redundancy`` and ``zero_redundancy_bucket_view``."""

from __future__ import annotations

import attrs

from ktrain.config.keys import key


@attrs.define(kw_only=True)
class ZeroRedundancyKeys:
    """Optimizer-state sharding over the data-parallel ranks (ZeRO stage 1)."""

    zero_redundancy: bool = key(
        False, "shard the optimizer state over the data-parallel ranks (torch ZeroRedundancyOptimizer)"
    )
    zero_redundancy_bucket_view: bool = key(
        False, "keep each rank's parameters in contiguous buckets (faster broadcasts, more memory)"
    )
