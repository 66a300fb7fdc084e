"""What a rank shows on the terminal: ktrain's own lines. Everything else goes to the rank's log file.

The log of rank N is ``output_dir/logs/rank-N.log``; each start of the rank (a resume, a restart) adds to it
after a line naming the start. There go the libraries' warnings (FutureWarning, UserWarning, ...), their
``logging`` output, their progress bars and prints, what the programs they start write (a compiler), the C++
warnings of torch and gloo, and the traceback of an error, which the launcher names in one line.

How: file descriptors 1 and 2 of the process point at the log, and ``sys.stdout`` and ``sys.stderr`` become
``Router`` streams that send a write to the terminal when the code that wrote it is ktrain's (the kernel,
module ``ktrain``, or a plugin: the package of an entry point of the ``ktrain`` group), else to the log. A
warning goes the same way by the code that called ``warnings.warn``; ktrain's own read
``ktrain: warning: MESSAGE`` on the terminal, from rank 0 (every rank warns alike; the others log theirs).
"""

from __future__ import annotations

import contextlib
import datetime
import importlib.metadata
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from types import FrameType
from typing import Any, TextIO

from ktrain import ENTRY_POINT_GROUP, __version__

LOGS = "logs"


def log_path(run_dir: Path, rank: int) -> Path:
    """The log file of rank ``rank`` of the run in ``run_dir``."""
    return run_dir / LOGS / f"rank-{rank}.log"


def own_packages() -> frozenset[str]:
    """The top-level packages whose code speaks to the user: ``ktrain`` and every installed plugin's."""
    entry_points = importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
    return frozenset({"ktrain", *(ep.value.split(":")[0].split(".")[0] for ep in entry_points)})


def is_own(frame: FrameType | None, packages: frozenset[str]) -> bool:
    """Whether ``frame`` runs code of one of ``packages`` (a module run with ``-m`` goes by its real name)."""
    if frame is None:
        return False
    name = frame.f_globals.get("__name__") or ""
    if name == "__main__":
        name = getattr(frame.f_globals.get("__spec__"), "name", name)
    return name.split(".")[0] in packages


class Router:
    """A text stream that writes ktrain's lines to ``terminal`` and everything else to ``log``."""

    def __init__(self, terminal: TextIO, log: TextIO, packages: frozenset[str]):
        self.terminal = terminal
        self.log = log
        self.packages = packages

    def write(self, text: str) -> int:
        """Write ``text`` where its writer's lines go (the caller of ``write``: ``print``'s caller for a print)."""
        try:
            writer = sys._getframe(1)
        except ValueError:  # no Python caller: the interpreter printing a traceback
            writer = None
        return (self.terminal if is_own(writer, self.packages) else self.log).write(text)

    def flush(self) -> None:
        for stream in (self.terminal, self.log):
            with contextlib.suppress(OSError, ValueError):
                stream.flush()

    def isatty(self) -> bool:
        """Whether ktrain's lines reach a terminal (its progress bar is drawn then)."""
        return self.terminal.isatty()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, buffer, ...: the log's, as fds 1 and 2 are
        return getattr(self.log, name)


def _calling_frame() -> FrameType | None:
    """The frame that raised the warning being shown: the first outside the ``warnings`` module and this one."""
    frame = sys._getframe(1)
    while frame is not None and frame.f_globals.get("__name__") in ("warnings", __name__):
        frame = frame.f_back
    return frame


class _Routing:
    """The streams, descriptors and warning display of one process while its output is routed."""

    def __init__(self, path: Path, rank: int):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.packages = own_packages()
        self.saved = {fd: os.dup(fd) for fd in (1, 2)}
        self.before = (sys.stdout, sys.stderr, warnings.showwarning)
        terminals = [_terminal(stream, fd) for stream, fd in ((sys.stdout, 1), (sys.stderr, 2))]
        log_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        for fd in (1, 2):
            os.dup2(log_fd, fd)
        os.close(log_fd)
        self.log = open(path, "a", buffering=1, encoding="utf-8", errors="backslashreplace")  # noqa: SIM115
        started = datetime.datetime.now().isoformat(timespec="seconds")
        self.log.write(f"===== ktrain {__version__}: rank {rank} started {started} (pid {os.getpid()})\n")
        self.routers = (Router(terminals[0], self.log, self.packages), Router(terminals[1], self.log, self.packages))
        sys.stdout, sys.stderr = self.routers
        warnings.showwarning = self.show_warning

    def show_warning(
        self, message: Any, category: type[Warning], filename: str, lineno: int, file: Any = None, line: Any = None
    ) -> None:
        """``warnings.showwarning``: ktrain's as ``ktrain: warning: ...`` on rank 0's terminal, others to the log."""
        if self.rank == 0 and is_own(_calling_frame(), self.packages):
            self.routers[1].terminal.write(f"ktrain: warning: {' '.join(str(message).split())}\n")
        else:
            (file or self.log).write(warnings.formatwarning(message, category, filename, lineno, line))

    def undo(self) -> None:
        """Put the process's output back as it was."""
        for router in self.routers:
            router.flush()
        sys.stdout, sys.stderr, warnings.showwarning = self.before
        for fd, saved in self.saved.items():
            os.dup2(saved, fd)
            os.close(saved)
        for router, previous in zip(self.routers, self.before[:2], strict=True):
            if router.terminal is not previous:
                router.terminal.close()
        self.log.close()


def _terminal(stream: TextIO, fd: int) -> TextIO:
    """A stream to where ``stream`` writes now, which stays there when descriptor ``fd`` is pointed elsewhere."""
    try:
        on_fd = stream.fileno() == fd
    except (AttributeError, OSError, ValueError):  # a stream of the caller's (a test capturing output)
        on_fd = False
    if not on_fd:
        return stream
    stream.flush()
    encoding, errors = getattr(stream, "encoding", "utf-8"), getattr(stream, "errors", "backslashreplace")
    return open(os.dup(fd), "w", buffering=1, encoding=encoding, errors=errors)


def route(run_dir: Path, rank: int) -> Path:
    """Route this process's output (see the module) for the rest of its life; return the log's path."""
    path = log_path(run_dir, rank)
    _Routing(path, rank)
    return path


@contextlib.contextmanager
def routed(run_dir: Path, rank: int) -> Iterator[Path]:
    """Route this process's output while the block runs (the one-rank run in the launcher); yield the log's path."""
    path = log_path(run_dir, rank)
    routing = _Routing(path, rank)
    try:
        yield path
    finally:
        routing.undo()
