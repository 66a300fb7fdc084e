"""Python's cycle collector during training: what is alive after the first step is left out of later collections.

Once a step has run, the process holds hundreds of thousands of long-lived objects (the modules, the compiled graphs
and their guards, the tokenizer, the dataset's rows). The collector's passes over its oldest generation walk all of
them, each pass a pause of the host that grows with their number, at moments nothing chooses: on a GPU the device
idles once it has run what the host had queued. ``settle`` collects once and moves everything alive then into the
permanent generation (``gc.freeze``), so later passes walk only what was made since; ``release`` hands it back to
the collector at the end of the run. Reference counting frees objects as before; only cycles among the settled
objects wait for ``release``. ``ktrain bench`` reports the collections and their time while timed (``Collections``).

Before that, ``imports_uncollected`` keeps the collector off while a process imports its libraries: the imports make
hundreds of thousands of objects that live as long as the process, and the collector, run every few hundred new
objects, walks the growing heap again and again: a large part of the CPU time of importing torch and transformers,
paid by every ``ktrain run`` (``python tests/benchmarks/launch_overhead.py`` times a tiny run's start).
"""

from __future__ import annotations

import contextlib
import gc
import time
from collections.abc import Iterator
from typing import Any


@contextlib.contextmanager
def imports_uncollected() -> Iterator[None]:
    """The collector off while the block runs (a process importing its libraries); then every object alive is left
    out of later collections, as by ``settle`` (without its collection: what an import makes stays)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()


def settle() -> None:
    """Collect, then leave every object alive now out of later collections."""
    gc.collect()
    gc.freeze()


def release() -> None:
    """Hand the settled objects back to the collector."""
    gc.unfreeze()


class Collections:
    """The collector's passes between ``start`` and ``stop``: how many, how many of the oldest generation, and
    the host's seconds in them."""

    def __init__(self) -> None:
        self.count = self.oldest = 0
        self.seconds = 0.0
        self._began = 0.0

    def _observe(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        self.count += 1
        self.oldest += info["generation"] == 2
        self.seconds += time.perf_counter() - self._began

    def start(self) -> None:
        self.count = self.oldest = 0
        self.seconds = 0.0
        gc.callbacks.append(self._observe)

    def stop(self) -> None:
        gc.callbacks.remove(self._observe)

    def totals(self) -> tuple[int, int, float]:
        """(passes, passes over the oldest generation, seconds)."""
        return self.count, self.oldest, self.seconds
