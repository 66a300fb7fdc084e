"""Datasets named by a Hugging Face Hub id, loaded with ``datasets.load_dataset`` when the data is prepared.

The `datasets` library is optional (``pip install "ktrain-llm[hub]"``). Before a load, whether the Hub
can be reached is known without waiting on the library's retries: offline mode is set
(``HF_DATASETS_OFFLINE``, ``HF_HUB_OFFLINE``), or the endpoint (``HF_ENDPOINT``, reached as the Hugging Face
libraries reach it, proxies included) does not answer within ``PROBE_SECONDS``. Offline, a dataset loads from the
local Hugging Face cache only, where an earlier load left it; one that is not there is a ``HubError``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
import threading
from typing import Any

INSTALL = 'pip install "ktrain-llm[hub]"'
PROBE_SECONDS = 2.5
DEFAULT_ENDPOINT = "https://huggingface.co"
_TRUE = {"1", "ON", "YES", "TRUE"}


class HubError(Exception):
    """A Hub dataset cannot be loaded; the message is one line saying why and what to do."""


def installed() -> bool:
    """Whether the `datasets` library can be imported (without importing it)."""
    return importlib.util.find_spec("datasets") is not None


def _offline_variable() -> str | None:
    """``NAME=value`` of the variable that turns offline mode on, read as `datasets` reads them."""
    value = os.environ.get("HF_DATASETS_OFFLINE")
    if value is not None:  # `datasets` lets its own variable decide when it is set
        return f"HF_DATASETS_OFFLINE={value}" if value.upper() in _TRUE else None
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        value = os.environ.get(name)
        if value:
            return f"{name}={value}" if value.upper() in _TRUE else None
    return None


@functools.cache
def _answers(endpoint: str) -> bool:
    """Whether ``endpoint`` answers an HTTP request within ``PROBE_SECONDS``, through the session (proxies,
    certificates) the Hugging Face libraries use; any answer counts, a refusal or silence does not."""
    from huggingface_hub.utils import get_session

    session, answered = get_session(), []

    def attempt() -> None:
        with contextlib.suppress(Exception):  # no answer, whatever the library raises for it
            session.head(endpoint, timeout=PROBE_SECONDS)
            answered.append(True)

    thread = threading.Thread(target=attempt, name="ktrain-hub-probe", daemon=True)
    thread.start()
    thread.join(PROBE_SECONDS)  # a name lookup has no timeout of its own: the thread is left to finish alone
    return bool(answered)


def offline_reason() -> str | None:
    """Why the Hub cannot be reached (offline mode set, or no connection), or None when it can."""
    variable = _offline_variable()
    if variable:
        return f"{variable} is set"
    endpoint = os.environ.get("HF_ENDPOINT", DEFAULT_ENDPOINT).rstrip("/")
    if not _answers(endpoint):
        return f"no answer from {endpoint} within {PROBE_SECONDS:g} s"
    return None


@contextlib.contextmanager
def _offline(datasets: Any) -> Any:
    """`datasets` in offline mode for the ``with`` block: the local cache only, no request, no retries."""
    before = datasets.config.HF_HUB_OFFLINE  # read by `datasets` on each load, set from the variables at import
    datasets.config.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        datasets.config.HF_HUB_OFFLINE = before


def _message(error: BaseException) -> str:
    lines = str(error).strip().splitlines()
    return lines[0] if lines else type(error).__name__


def load(path: str, name: str | None, split: str, data_files: str | list[str] | None) -> Any:
    """Split ``split`` of Hub dataset ``path`` (config ``name``, files ``data_files`` of it), a
    `datasets.Dataset`, loaded once per process.

    Offline (see ``offline_reason``) it comes from the local Hugging Face cache or not at all. Raises
    ``HubError`` with one line saying why it cannot be loaded.
    """
    files = [data_files] if isinstance(data_files, str) else data_files
    return _load(path, name, split, tuple(files) if files else None)


@functools.cache
def _load(path: str, name: str | None, split: str, data_files: tuple[str, ...] | None) -> Any:
    if not installed():
        raise HubError(f"{path} is a Hugging Face Hub id, loaded with the `datasets` library: `{INSTALL}`")
    import datasets

    reason = offline_reason()
    files = list(data_files) if data_files else None
    try:
        with _offline(datasets) if reason else contextlib.nullcontext():
            return datasets.load_dataset(path, name=name, split=split, data_files=files)
    except ConnectionError:
        if not reason:
            raise HubError(f"{path}: the Hugging Face Hub did not answer; try again") from None
        short = path.split("/")[-1]
        raise HubError(
            f"{path} is a Hugging Face Hub id, the Hub cannot be reached ({reason}) and the dataset is not in "
            f"the local Hugging Face cache ({datasets.config.HF_DATASETS_CACHE}): load it once where the Hub "
            f"can be reached, or `hf download {path} --repo-type dataset --local-dir data/{short}` and give that "
            "folder"
        ) from None
    except Exception as e:  # the library's own errors: a missing dataset, config or split, a bad file
        offline = f" (the Hub cannot be reached: {reason}; only the local cache was read)" if reason else ""
        raise HubError(f"{path}: {_message(e)}{offline}") from None


def launch_problem(path: str, name: str | None, split: str, data_files: str | list[str] | None) -> str | None:
    """What stops a run from loading Hub dataset ``path``, known before any rank starts, or None.

    Offline the dataset is loaded from the local cache here (memory-mapped, no request); online the
    download is left to the run's preprocessing.
    """
    if not installed() or offline_reason():
        if installed():
            import datasets  # noqa: F401  (it sets its logger's level when imported)
        library_log = logging.getLogger("datasets")  # its notes on reading the cache belong to the run's log
        level = library_log.level
        library_log.setLevel(logging.ERROR)
        try:
            load(path, name, split, data_files)
        except HubError as e:
            return str(e)
        finally:
            library_log.setLevel(level)
    return None
