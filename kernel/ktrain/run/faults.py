"""Faults placed exactly, for tests: ``KTRAIN_FAULT=<where>:<step>:<rank>:<action>[,...]``.

``step`` is the optimizer step (1-based) at which the fault fires; ``rank`` the global rank (``*`` for
every rank). ``where`` is one of:

- ``forward``, ``backward``: before each micro-batch's forward or backward of that step;
- ``optimizer``: after the last backward, before the non-finite-loss check and the optimizer step;
- ``loss``: the step's loss as that check sees it (for the ``nan`` action);
- ``save-start``: every rank, the staging folder made, before the format plugin writes;
- ``save-shards``: every rank, after the format plugin wrote its files, before the rank's own state;
- ``save-before-commit``: rank 0, manifest written and fsynced, before the rename that commits;
- ``save-after-commit``: rank 0, after the rename, before older checkpoints are pruned.

``action`` is one of ``raise`` (``InjectedFault``), ``exit`` (code 3), ``sigkill`` (this process),
``sigkill-agent`` (the launching agent, then this process: what a pre-empted machine looks like),
``hang`` (sleep for an hour), ``sleep=S`` (a stall of S seconds, then go on), ``enospc`` (an
``OSError`` "No space left on device") and ``nan`` (at ``loss``: this rank's loss becomes NaN).
A fault fires in the first attempt only: ranks restarted by ``--max-restarts`` run without faults.
Unset, each check is one test of an empty dictionary.
"""

from __future__ import annotations

import errno
import functools
import math
import os
import signal
import time

from ktrain.run.forked import AGENT_PID_ENV


@functools.cache
def _faults() -> dict[tuple[str, int, str], str]:
    """The faults of ``KTRAIN_FAULT``, read at the first check: a rank forked from a process that imported this
    module earlier (``ktrain.run.forked``) has its own environment only from its start."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return {}
    spec = os.environ.get("KTRAIN_FAULT", "")
    items = (item.split(":") for item in spec.split(",") if item)
    return {(where, int(step), rank): action for where, step, rank, action in items}


class InjectedFault(RuntimeError):
    """The error a ``raise`` fault raises."""


def _action(where: str, step: int, rank: int) -> str | None:
    faults = _faults()
    return faults.get((where, step, str(rank))) or faults.get((where, step, "*"))


def maybe_fault(where: str, step: int, rank: int) -> None:
    """Fire the fault configured for this place, step and rank, if any."""
    if not _faults():
        return
    action = _action(where, step, rank)
    if action is None:
        return
    if action == "raise":
        raise InjectedFault(f"injected fault at {where}, step {step}, rank {rank}")
    if action == "exit":
        os._exit(3)
    if action == "sigkill-agent":
        if AGENT_PID_ENV in os.environ:  # a rank of the elastic agent (one process is its own agent)
            os.kill(int(os.environ[AGENT_PID_ENV]), signal.SIGKILL)
        action = "sigkill"
    if action == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if action == "hang":
        time.sleep(3600)
    if action.startswith("sleep="):
        time.sleep(float(action.removeprefix("sleep=")))
    if action == "enospc":
        raise OSError(errno.ENOSPC, f"No space left on device (injected at {where}, step {step}, rank {rank})")


def loss(step: int, rank: int, value: float) -> float:
    """``value``, or NaN where a ``loss:<step>:<rank>:nan`` fault is set."""
    if not _faults():
        return value
    return math.nan if _action("loss", step, rank) == "nan" else value
