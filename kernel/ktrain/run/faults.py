"""Faults placed exactly, for tests: ``KTRAIN_FAULT=<where>:<step>:<rank>:<action>[,...]``.

``where`` is ``forward``, ``backward``, ``optimizer`` or ``save-before-commit``; ``step`` the optimizer
step (1-based) at which it fires; ``rank`` the global rank (``*`` for all); ``action`` one of
``raise``, ``exit`` (code 3), ``sigkill`` (this process) and ``hang`` (sleep for an hour). Unset, the
check is one dictionary lookup.
"""

from __future__ import annotations

import os
import signal
import time

_SPEC = os.environ.get("KTRAIN_FAULT", "")
_FAULTS = {
    (where, int(step), rank): action
    for where, step, rank, action in (item.split(":") for item in _SPEC.split(",") if item)
}


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault raises."""


def maybe_fault(where: str, step: int, rank: int) -> None:
    """Fire the fault configured for this place, step and rank, if any."""
    if not _FAULTS:
        return
    action = _FAULTS.get((where, step, str(rank))) or _FAULTS.get((where, step, "*"))
    if action is None:
        return
    if action == "raise":
        raise InjectedFault(f"injected fault at {where}, step {step}, rank {rank}")
    if action == "exit":
        os._exit(3)
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        time.sleep(3600)
