"""Stopping a run on SIGINT (Ctrl-C) or SIGTERM (a scheduler's stop) cleanly, every rank at the same place.

Inside ``handled`` (each rank, and a run of one process) both signals are this module's. Before
the training loop a signal raises ``Interrupted`` at once: nothing of the run is half-written then (the
run files and the data cache are written to temporary names and renamed). Inside the loop
(``deferred``) the handler only records the signal; the step goes on to the check that every rank makes
before its optimizer step, where the ranks learn together whether any of them was asked to stop
(``agree``, in the same collective as the non-finite loss check), and every rank raises
``Interrupted`` there. A checkpoint being saved is therefore always finished first, and no rank waits
in a collective for a peer that has gone.

The process then exits with ``128 + signal`` (130 for SIGINT, 143 for SIGTERM), printing no traceback.

A rank that cannot reach that check (stuck in a collective whose peer is gone, as when the launcher stops
the ranks after another one failed) exits with the same code ``STOP_GRACE_S`` seconds after the signal,
from a watchdog thread: before the launcher's own kill (30 s), so that it is seen as stopped, not as the
failure. A checkpoint cut short then is never committed (commits are a rename of a complete folder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM)
STOP_GRACE_S = float(os.environ.get("KTRAIN_STOP_GRACE_S", "5"))

_received = 0  # the signal asked for, 0 when none
_deferred = False


class Interrupted(BaseException):  # like KeyboardInterrupt: not an error of the run
    """The run was asked to stop by ``signum``; raised on every rank at the same step, or at once before the loop."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by the signal: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + self.signum


def _handle(signum: int, frame: Any) -> None:
    global _received
    del frame
    first = not _received
    _received = _received or signum
    if not _deferred:
        raise Interrupted(signum)
    if first:
        threading.Thread(target=_exit_after_grace, args=(signum,), daemon=True).start()


def _exit_after_grace(signum: int) -> None:
    """End this process with the signal's exit code when the step has not stopped it within ``STOP_GRACE_S``."""
    time.sleep(STOP_GRACE_S)
    os._exit(128 + signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Inside: SIGINT and SIGTERM are handled as described above (call from the main thread); the handlers
    before are put back after."""
    global _received
    _received = 0
    previous = {signum: signal.getsignal(signum) for signum in SIGNALS}
    for signum in SIGNALS:
        signal.signal(signum, _handle)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def requested() -> int:
    """The signal this process was asked to stop by, or 0."""
    return _received


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Inside: a signal is recorded, and ``agree`` stops every rank at the next check before an optimizer step."""
    global _deferred
    _deferred = True
    try:
        yield
    finally:
        _deferred = False


def agree(signals: list[float]) -> None:
    """Raise ``Interrupted`` when any rank was asked to stop; ``signals`` holds each rank's ``requested()``,
    summed over ranks (every rank gets the same list, so all decide alike)."""
    asked = [int(s) for s in signals if s]
    if asked:
        raise Interrupted(max(asked))
