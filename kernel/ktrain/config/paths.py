"""Which names are local paths and which are Hugging Face Hub ids, and the checks of the path keys.

A model (``base_model``, ``base_model_config``, ``tokenizer_config``) is a local folder or a Hub id,
downloaded by the run; so is a dataset, loaded by `datasets` when the run prepares its data. ``ktrain
check`` contacts no network: a name is a Hub id by its form alone. ``ktrain run`` refuses, before any
rank starts, a Hub dataset it cannot load: `datasets` not installed, or the Hub out of reach and the
dataset not in the local Hugging Face cache (see ``ktrain.data.hub``).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

from ktrain.config.report import Report
from ktrain.data import hub

# Suffixes of files a path key may name: a name ending in one is a local path, never a Hub id.
FILE_SUFFIXES = (".jsonl", ".json", ".parquet", ".csv", ".arrow", ".txt", ".gz", ".safetensors", ".bin")
WEIGHTS = ("*.safetensors", "*.bin", "*.safetensors.index.json", "*.bin.index.json")
MODEL_KEYS = ("base_model", "base_model_config", "tokenizer_config")
DATA_KEYS = ("datasets", "test_datasets", "pretraining_dataset")
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")  # name or org/name


def exists(path: str) -> bool:
    """Whether ``path`` exists; False (not an OSError) for names too long or with a NUL byte."""
    return os.path.exists(os.path.expanduser(path))


def looks_local(name: str) -> bool:
    """A local path: starts like one (``/``, ``.``, ``~``), exists, names a file by its suffix, ends in
    ``/``, or has a form no Hub id has (more than one ``/``, spaces, ``..``); else a Hub id."""
    return (
        name.startswith((".", "/", "~"))
        or exists(name)
        or name.endswith("/")
        or name.lower().endswith(FILE_SUFFIXES)
        or not _HUB_ID.match(name)
        or ".." in name
        or "--" in name
    )


def _weightless(folder: str) -> bool:
    """A model folder with a config.json and no weights file."""
    root = Path(folder).expanduser()
    if not (root / "config.json").is_file():
        return False
    return not any(next(root.glob(pattern), None) for pattern in WEIGHTS)


def check_paths(config: Any, report: Report, launching: bool) -> None:
    """Every path key: local ones must exist (a model folder with its weights), ``output_dir`` must be
    writable; when ``launching`` (``ktrain run``), a Hub dataset must be loadable (``hub.launch_problem``)."""
    for key in MODEL_KEYS:
        value = getattr(config, key)
        if value and looks_local(value) and not exists(value):
            report.error(key, f"{value} does not exist; give a local model folder or a Hub id (org/name)")
    if not config.base_model and not config.base_model_config:
        report.error("base_model", "required: a local HF model folder or a Hub id")
    elif (
        config.base_model
        and exists(config.base_model)
        and not config.random_init_weights
        and _weightless(config.base_model)
    ):
        report.error(
            "base_model",
            f"{config.base_model} holds config.json but no weights (*.safetensors, *.bin): give the folder "
            "that holds them, or set random_init_weights: true to train from random weights",
        )
    for key in DATA_KEYS:
        for i, entry in enumerate(getattr(config, key)):
            if not entry.path or exists(entry.path):
                continue
            if looks_local(entry.path):
                report.error(f"{key}[{i}].path", f"{entry.path} does not exist")
                continue
            if launching:  # check may run where the Hub or the cache is not; it shows the id (``hub_datasets``)
                problem = hub.launch_problem(entry.path, entry.name, entry.split, entry.data_files)
                if problem:
                    report.error(f"{key}[{i}].path", problem)
    if config.exact_match_eval and not os.path.isfile(config.exact_match_eval):
        report.error("exact_match_eval", f"{config.exact_match_eval} is not a file")
    out = Path(config.output_dir).expanduser().absolute()
    existing = next((p for p in (out, *out.parents) if os.path.exists(p)), None)
    if existing is not None and (not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK)):
        report.error("output_dir", f"{config.output_dir} cannot be written ({existing} is not a writable folder)")


def hub_models(config: Any) -> list[str]:
    """``key: id`` of the model keys that name a Hub id, for ``ktrain check`` to show."""
    return [
        f"{key}: {getattr(config, key)}"
        for key in MODEL_KEYS
        if getattr(config, key) and not looks_local(getattr(config, key))
    ]


def hub_datasets(config: Any) -> list[str]:
    """``key[i].path: id`` of the dataset entries that name a Hub id, for ``ktrain check`` to show (with the
    install command when `datasets` is not installed)."""
    missing = "" if hub.installed() else f"; needs `{hub.INSTALL}`"
    return [
        f"{key}[{i}].path: {entry.path} (from the Hub at preprocess{missing})"
        for key in DATA_KEYS
        for i, entry in enumerate(getattr(config, key))
        if entry.path and not looks_local(entry.path)
    ]
