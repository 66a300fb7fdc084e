"""Ranks forked from a process that imported the libraries once (multiprocessing's fork server).

A rank started as ``python -m MODULE`` imports torch, transformers and the plugins itself: about five
seconds of CPU per rank, paid again by every rank of a machine at the same moment. ``ktrain run`` starts
its ranks instead from a fork server that imported them once (``PRELOAD``), so a rank begins where the
imports end. The fork server is a single-threaded process of its own, started once the launcher has
prepared the run directory (it imports while the launcher tokenizes), with the launcher's environment at
that moment; it never touches a device, so each rank sets up CUDA and its process group itself, as a fresh
process does. The launcher kills it when its ranks have ended or will not start (``stop_server``).

``rank_entry`` is what a forked rank runs: the same ``main(argv)`` of the worker module that ``python -m``
would run, with the same exit codes (a stopped rank 130/143/138, bad input 2), the same error file for
the launcher's one line, and the traceback in the rank's log.
"""

from __future__ import annotations

import contextlib
import importlib
import multiprocessing
import multiprocessing.forkserver
import os
import signal
import sys
import tempfile
import traceback
from collections.abc import Iterable
from types import FrameType

from ktrain.run.hard_exit import end_process
from ktrain.run.host_gc import imports_uncollected

PRELOAD_ENV = "KTRAIN_PRELOAD"
"""Comma-separated modules the fork server imports before it forks ranks (set by ``start_server``)."""
AGENT_PID_ENV = "KTRAIN_AGENT_PID"
"""The launcher's process id (the elastic agent), which a forked rank's parent (the fork server) is not."""
PRELOAD = ("ktrain.run.worker", "ktrain.run.trainer", "transformers", "transformers.modeling_utils")
"""What every rank imports: the kernel's rank side and transformers' model machinery."""
SOCKET_PATH_MAX = 107
"""The bytes of a Unix socket's path on Linux (``sun_path`` holds 108, with the terminating zero)."""
SOCKET_NAME_ROOM = 32
"""What multiprocessing adds to the temporary folder for the fork server's socket: a folder and the socket's name."""


def start_server(nproc: int, extra: tuple[str, ...] = ()) -> None:
    """Start multiprocessing's fork server for ``nproc`` ranks of this machine, importing ``PRELOAD`` and
    ``extra`` (the runtime modules of the run's plugins), unless it runs already.

    It starts now, from this process's environment now, and imports while this process goes on (the launcher
    tokenizes meanwhile); the first rank's fork waits for the imports to end. ``OMP_NUM_THREADS`` is set here
    when the user did not: each rank's share of this machine's cores, read once when torch loads."""
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    os.environ[PRELOAD_ENV] = ",".join(dict.fromkeys((*PRELOAD, *extra)))
    os.environ[AGENT_PID_ENV] = str(os.getpid())
    multiprocessing.set_forkserver_preload([f"{__package__}.fork_server"])
    chosen = tempfile.tempdir
    tempfile.tempdir = _socket_folder(tempfile.gettempdir())  # where multiprocessing makes the socket's folder
    try:
        multiprocessing.forkserver.ensure_running()
    finally:
        tempfile.tempdir = chosen


def import_rank_modules(extra: Iterable[str] = ()) -> None:
    """Import ``PRELOAD`` and ``extra`` (the runtime modules of the run's plugins) with the collector paused
    (``host_gc.imports_uncollected``). A module that fails to import is left for the rank, which imports it again
    and reports the error where it belongs."""
    with imports_uncollected():
        for name in dict.fromkeys((*PRELOAD, *extra)):
            with contextlib.suppress(Exception):
                importlib.import_module(name)


def _socket_folder(folder: str) -> str:
    """``folder`` (the temporary folder, ``TMPDIR``), or where its path is too long for the fork server's socket
    in it (a cluster's per-job folder can be), the first writable one of the system's short temporary folders."""
    if len(os.fsencode(folder)) + SOCKET_NAME_ROOM <= SOCKET_PATH_MAX:
        return folder
    short = (f for f in ("/tmp", "/var/tmp", "/dev/shm") if os.path.isdir(f) and os.access(f, os.W_OK | os.X_OK))
    return next(short, folder)


def stop_server() -> None:
    """End the fork server ``start_server`` started, if it runs: its ranks have ended, or will not start.

    Killed, not asked: asked (its pipe closed), it finishes its imports first and then the interpreter's
    teardown with torch and transformers loaded; all that time it holds the run's output stream open, so a
    caller reading that to its end (a script, a test) waits after the run has ended."""
    server = multiprocessing.forkserver._forkserver  # the module's one server; ``_stop`` closes its pipe and reaps it
    if server._forkserver_pid is not None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(server._forkserver_pid, signal.SIGKILL)
        server._stop()


def _stopped_while_starting(signum: int, frame: FrameType | None) -> None:
    """SIGINT, SIGTERM or SIGUSR1 before the rank's own handlers are in place: nothing is written yet, so
    leave at once, quietly."""
    del frame
    os._exit(128 + signum)


def rank_entry(module: str, *argv: str) -> int:
    """One rank: ``MODULE.main(argv)`` as ``python -m MODULE ARGV...`` runs it, in a forked process.

    A non-zero exit code leaves at once (``end_process``), as does an error, after its traceback went to
    the rank's log and torch elastic's error file recorded it; a finished rank returns 0 to the agent.
    """
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1):
        signal.signal(signum, _stopped_while_starting)
    for signum in (signal.SIGHUP, signal.SIGQUIT):  # the fork server ignores them; a rank does not
        signal.signal(signum, signal.SIG_DFL)
    from torch.distributed.elastic.multiprocessing.errors import record

    try:
        code = record(importlib.import_module(module).main)(list(argv))
    except SystemExit as e:  # argparse's own exit
        end_process(e.code if isinstance(e.code, int) else 1)
    except BaseException:  # recorded in the error file for the launcher; the traceback for the rank's log
        traceback.print_exc()
        end_process(1)
    if code:
        end_process(code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):
            stream.flush()
    return 0
