"""Import DeepSpeed for this machine: its CPU accelerator (gloo) when there is no CUDA device.

DeepSpeed picks its accelerator once, when it is first imported, from ``DS_ACCELERATOR``; ktrain sets it
to ``cpu`` where CUDA is absent (unless the user chose one), so users never have to.
"""

from __future__ import annotations

import os
import sys
from types import ModuleType


def load_deepspeed() -> ModuleType:
    """The ``deepspeed`` module, imported on the CPU accelerator when no CUDA device is present."""
    if "deepspeed" not in sys.modules:
        import torch

        if not torch.cuda.is_available():
            os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    return deepspeed
