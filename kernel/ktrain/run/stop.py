"""Stopping a run on a signal, every rank at the same place: SIGINT (Ctrl-C) at once, SIGTERM and SIGUSR1
(a scheduler's stop, and SLURM's warning before the time limit) after a checkpoint.

Inside ``handled`` (each rank, and a run of one process) these signals are this module's. Before the
training loop a signal raises ``Interrupted`` at once: nothing of the run is half-written then (the run
files and the data cache are written to temporary names and renamed), and there is nothing to save.
Inside the loop (``deferred``) the handler only records the signal; the step goes on to the check that
every rank makes before its optimizer step, where the ranks learn together whether any of them was asked
to stop (``agree``, in the same collective as the non-finite loss check), and all decide alike:

- SIGINT: every rank raises ``Interrupted`` there, before the optimizer step; nothing is saved.
- SIGTERM or SIGUSR1 (pre-emption): the step is finished (optimizer step, its log line, a save that was
  due), then the trainer saves the step's checkpoint (atomic, as every save) unless that step was just
  saved, and every rank raises ``Interrupted`` (``agreed``). A run with ``auto_resume_from_checkpoints:
  true`` started again continues from it exactly: the stop loses no step.

The process then exits with ``128 + signal`` and no traceback: 130 for SIGINT, 143 for SIGTERM, 138 for
SIGUSR1. 143 and 138 say "stopped to be requeued": the step's checkpoint is there (unless
``save_strategy: no``); a scheduler's script requeues the job on them (docs/multinode.md).

A rank sent SIGINT or SIGTERM that cannot reach the check (stuck in a collective whose peer is gone, as
when the launcher stops the ranks after another one failed) exits with the same code ``STOP_GRACE_S``
seconds after the signal, from a watchdog thread: before the launcher's own kill, so that it is seen as
stopped, not as the failure; the watchdog stands down once every rank has agreed to stop, so that a
pre-empted step and its save may take longer. SIGUSR1 arms no watchdog: the launcher forwards it to
every rank and nothing else sends it, so a step of any length is finished and saved. A checkpoint cut
short is never committed (commits are a rename of a complete folder).
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)
SAVING = (signal.SIGTERM, signal.SIGUSR1)
"""The signals that stop a run after the step and its checkpoint (pre-emption); SIGINT stops at once."""
STOP_GRACE_S = float(os.environ.get("KTRAIN_STOP_GRACE_S", "5"))

_received = 0  # the signal asked for, 0 when none
_agreed = 0  # the signal every rank agreed to stop by after the step's checkpoint, 0 when none
_deferred = False


class Interrupted(BaseException):  # like KeyboardInterrupt: not an error of the run
    """The run was asked to stop by ``signum``; raised on every rank at the same step, or at once before the loop."""

    def __init__(self, signum: int):
        super().__init__(f"interrupted by {signal.Signals(signum).name}")
        self.signum = signum

    @property
    def exit_code(self) -> int:
        """The shell's code for a process ended by the signal: 130 for SIGINT, 143 for SIGTERM, 138 for SIGUSR1."""
        return 128 + self.signum


def _handle(signum: int, frame: Any) -> None:
    global _received
    del frame
    first = not _received
    _received = _received or signum
    if not _deferred:
        raise Interrupted(signum)
    if first and signum != signal.SIGUSR1:
        threading.Thread(target=_exit_after_grace, args=(signum,), daemon=True).start()


def _exit_after_grace(signum: int) -> None:
    """End this process with the signal's exit code when the ranks have not agreed to stop within ``STOP_GRACE_S``."""
    time.sleep(STOP_GRACE_S)
    if not _agreed:
        os._exit(128 + signum)


@contextlib.contextmanager
def handled() -> Iterator[None]:
    """Inside: SIGINT, SIGTERM and SIGUSR1 are handled as described above (call from the main thread); the
    handlers before are put back after."""
    global _received, _agreed
    _received = _agreed = 0
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


def agreed() -> int:
    """The signal every rank agreed to stop by once the step is finished and saved (SIGTERM or SIGUSR1), or 0."""
    return _agreed


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
    """Decide, alike on every rank, whether the run stops: ``signals`` holds each rank's ``requested()``, summed
    over ranks (every rank gets the same list). SIGINT on any rank raises ``Interrupted`` now; otherwise a
    SIGTERM or SIGUSR1 is recorded for ``agreed`` (SIGTERM first when both were sent)."""
    global _agreed
    asked = {int(s) for s in signals if s}
    if signal.SIGINT in asked:
        raise Interrupted(signal.SIGINT)
    if asked and not _agreed:
        _agreed = max(asked)
