"""bitsandbytes stays out of runs whose base is not quantized.

peft imports bitsandbytes whenever it is installed (``peft.helpers`` when peft is imported, its LoRA
dispatchers when an adapter is attached). Importing bitsandbytes costs seconds and, on a CPU with
AVX512-BF16, logs a warning about a kernel it fails to fetch from the Hub, which a plain LoRA run never
uses. ``hidden_bitsandbytes`` makes bitsandbytes look absent to peft while the adapter is imported and
attached, and restores it (peft's cached answers included) afterwards.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager

NAME = "bitsandbytes"


def _forget_peft_answers() -> None:
    """Clear peft's cached "is bitsandbytes available" answers, so that a later quantized base finds it."""
    utils = sys.modules.get("peft.import_utils")
    for name in ("is_bnb_available", "is_bnb_4bit_available"):
        cached = getattr(utils, name, None)
        if cached is not None and hasattr(cached, "cache_clear"):
            cached.cache_clear()


@contextmanager
def hidden_bitsandbytes(hide: bool) -> Iterator[None]:
    """Within the block, ``import bitsandbytes`` fails and ``find_spec`` finds none, when ``hide`` is true
    and bitsandbytes was not imported already; nothing changes otherwise."""
    if not hide or NAME in sys.modules:
        yield
        return
    sys.modules[NAME] = None  # type: ignore[assignment]  # the import system's mark of "not importable"
    try:
        yield
    finally:
        if sys.modules.get(NAME, 0) is None:
            del sys.modules[NAME]
        _forget_peft_answers()
