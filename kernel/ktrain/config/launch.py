"""What a check knows about where the config will run: the number of ranks and their device type."""

from __future__ import annotations

from typing import Literal

import attrs


@attrs.frozen
class Launch:
    """The ranks ``ktrain run`` is about to start (``ktrain check --world-size N``: only their number).

    ``world_size`` is None when the mesh sizes could not be resolved (the report already says why);
    ``device`` is the device type every rank will use, or None where it is not known (``ktrain check``
    validates anywhere, without a GPU); ``capability`` is the lowest CUDA compute capability of the GPUs
    the ranks will use, ``(major, minor)``, or None off a GPU or where it is not known. ``planned`` is true
    when no rank will start from this check (``ktrain plan`` trying a layout): a check that needs the run's
    libraries (which import torch) or this machine is left out.
    """

    world_size: int | None
    device: Literal["cuda", "cpu"] | None = None
    capability: tuple[int, int] | None = None
    planned: bool = False
