"""An import a run did not ask for, stopped where it starts: DeepSpeed's, in a run that does not use it.

accelerate's ``extract_model_from_parallel``, which transformers' ``save_pretrained`` calls on every export,
imports DeepSpeed whenever it is installed, only to ask whether the model is a ``DeepSpeedEngine``: an FSDP
or DDP run paid the import on every rank at its end and printed DeepSpeed's "Setting accelerator to CPU".
No object is a ``DeepSpeedEngine`` unless DeepSpeed was imported, so accelerate asks only then: a run with
``deepspeed:`` (whose plugin imports it) unwraps its engine as before.
"""

from __future__ import annotations

import importlib.util
import sys


def deepspeed_imported() -> bool:
    """Whether DeepSpeed has been imported in this process (only then can a model be a ``DeepSpeedEngine``)."""
    return "deepspeed" in sys.modules


def no_unused_deepspeed() -> None:
    """Make accelerate's unwrapping import DeepSpeed only when it is imported already (see the module)."""
    if importlib.util.find_spec("accelerate") is None:
        return
    import accelerate.utils.other as other  # transformers imports it with its models anyway

    if hasattr(other, "is_deepspeed_available"):
        other.is_deepspeed_available = deepspeed_imported
