"""The plugin's config keys: ``powersgd``, ``powersgd_rank`` and ``powersgd_start_step``, with their ranges."""

from typing import Any

import attrs

from ktrain.config.keys import key


def at_least_one(instance: Any, attribute: Any, value: int) -> None:
    if value < 1:
        raise ValueError(f"must be 1 or more, not {value}")


def after_the_first_steps(instance: Any, attribute: Any, value: int) -> None:
    if value < 2:
        raise ValueError(f"must be 2 or more, not {value}: DDP settles its buckets during the first step")


@attrs.define(kw_only=True)
class PowerSGDKeys:
    """PowerSGD: each gradient matrix sent as a low-rank approximation, the error kept for the next step."""

    powersgd: bool = key(False, "compress the gradients DDP averages with PowerSGD (needs more than one rank)")
    powersgd_rank: int = key(
        1, "rank of the approximation of each gradient matrix (higher: closer, more to send)", validator=at_least_one
    )
    powersgd_start_step: int = key(
        2, "optimizer steps of plain all-reduce before compression starts", validator=after_the_first_steps
    )
