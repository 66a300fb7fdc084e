"""How a rank's end reaches the launcher: bad input (exit 2, one line naming the key), or a crash (exit 1).

What only a rank can find (a dataset that tokenizes to nothing, a checkpoint that cannot be resumed, a
disk too small for the checkpoint) is bad input, not a crash: the rank writes its one line into torch
elastic's error file marked as such and exits with code 2, printing no traceback; the launcher finds
the mark and prints the line. Anything else a rank raises is recorded by ``@record`` as before.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

EXIT_BAD_INPUT = 2
MARK = "bad_input"


def bad_input_types() -> tuple[type[BaseException], ...]:
    """The errors that mean the user's input is wrong (config, data, files, disk space), not ktrain."""
    from ktrain.config.report import ConfigError
    from ktrain.data.reading import DataError
    from ktrain.plugins import PluginError
    from ktrain.run.manifest import NoSpaceLeft

    return (ConfigError, DataError, PluginError, NoSpaceLeft, FileNotFoundError)


def one_line(error: BaseException) -> str:
    """The message of ``error`` for the terminal: a config report of one problem is that problem's line."""
    report = getattr(error, "report", None)
    if report is not None and len(report.errors) == 1 and not report.warnings:
        return str(report.errors[0])
    return str(error)


def record_bad_input(error: BaseException) -> None:
    """Write ``error``'s line into this rank's torch elastic error file, marked as bad input."""
    path = os.environ.get("TORCHELASTIC_ERROR_FILE")
    if not path:
        return
    data = {"message": {"message": one_line(error), "extraInfo": {"timestamp": str(int(time.time())), "ktrain": MARK}}}
    with open(path, "w", encoding="utf-8") as out:
        json.dump(data, out)


def is_bad_input(failure: Any) -> bool:
    """Whether a failed rank (torch elastic's ``ProcessFailure``) recorded bad input."""
    message = getattr(failure, "error_file_data", {}).get("message")
    return isinstance(message, dict) and message.get("extraInfo", {}).get("ktrain") == MARK
