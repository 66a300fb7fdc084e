"""Ending a ktrain process without the interpreter's teardown.

After a run has used torch.distributed, the teardown can abort a process whose work is done: gloo's
worker threads may still hold tensors when the interpreter finalizes, and releasing them then ends in
``terminate called without an active exception`` (SIGABRT), seen here on CPU ranks under load and in
torch's own tracker (pytorch/pytorch#179291). By the time ``end_process`` is called every file of the run
is written, synced and closed and the process group is destroyed, so skipping the teardown loses
nothing, and a finished run (or a refused one) keeps its exit code.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def end_process(code: int, *, finalize_multiprocessing: bool = False) -> NoReturn:
    """Flush the output streams and logging, then exit with ``code`` at once (``os._exit``).

    ``finalize_multiprocessing`` first runs what multiprocessing runs at the interpreter's exit: it removes its
    temporary folder (where the fork server's socket was) and unlinks its named semaphores. The launcher asks
    for it; a rank does not (there a queue's finalizer may wait on its feeder thread)."""
    if finalize_multiprocessing and "multiprocessing.util" in sys.modules:
        sys.modules["multiprocessing.util"]._run_finalizers()
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`ktrain hooks | head`), a closed stream
            stream.flush()
    os._exit(code)
