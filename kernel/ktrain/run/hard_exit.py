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


def end_process(code: int) -> NoReturn:
    """Flush the output streams and logging, then exit with ``code`` at once (``os._exit``)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe (`ktrain hooks | head`), a closed stream
            stream.flush()
    os._exit(code)
