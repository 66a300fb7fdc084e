"""Imported by multiprocessing's fork server before it forks ranks (``ktrain.run.forked``): it imports the
modules named in ``KTRAIN_PRELOAD`` with the process's output sent nowhere, so the libraries' import-time
messages do not reach the terminal once more (each rank's log has its own start). A module that fails to
import is left for the rank, which imports it again and reports the error where it belongs.

The fork server ignores the signals a terminal or a scheduler sends the whole process group, from before
its imports (a Ctrl-C while it imports ends the launcher, and so the fork server, with no traceback): the
agent learns of its ranks' ends through it, so it must outlive them while they finish and save their step;
the launcher ends it (``stop_server``). Each rank sets these signals' handlers at its start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from ktrain.run.forked import import_rank_modules

IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1, signal.SIGHUP, signal.SIGQUIT)
"""The signals the fork server ignores."""


def _import_quietly(modules: list[str]) -> None:
    """Import ``PRELOAD`` and ``modules`` (``import_rank_modules``), file descriptors 1 and 2 pointed at the null
    device meanwhile."""
    saved = [os.dup(fd) for fd in (1, 2)]
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        for fd in (1, 2):
            os.dup2(null, fd)
        import_rank_modules(modules)
    finally:
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()
        for fd, copy in zip((1, 2), saved, strict=True):
            os.dup2(copy, fd)
            os.close(copy)
        os.close(null)


for _signum in IGNORED:
    signal.signal(_signum, signal.SIG_IGN)
_import_quietly([name for name in os.environ.get("KTRAIN_PRELOAD", "").split(",") if name])
