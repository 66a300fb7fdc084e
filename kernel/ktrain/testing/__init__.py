"""``ktrain.testing``: the pytest plugin for plugin authors. Opt in from your conftest.py::

    pytest_plugins = ["ktrain.testing"]

(or ``pytest -p ktrain.testing``). It is never loaded by itself: ktrain registers no ``pytest11``
entry point, so unrelated test suites do not see it. It gives:

- ``ktrain_model_dir``: a tiny Llama model folder with its tokenizer, made in code (session-wide);
- ``ktrain_dataset``: a small chat dataset (jsonl, ``type: chat_template``) (session-wide);
- ``ktrain_project``: a ``KtrainProject``, a folder where ``config(yaml_text, **keys)`` writes a run config
  over those, ``train(config, nproc=N)`` runs ``ktrain run`` for real, ``ktrain(*args)`` any command,
  ``plan(yaml_text)`` checks a config in process, and ``install_plugin(name, source)`` makes a plugin
  written in the test visible to those processes;
- ``ktrain_recorder``: a ``HookRecorder`` of the hook calls of the project's runs, rank by rank;
- ``ShardingConformance``: the conformance suite a sharding plugin subclasses;
- ``read_metrics(run_dir, key)``: step -> value from a run's metrics.jsonl;
- for tests that lay out their own folder: ``model_dir(root, weights=False)`` (the tiny model in
  ``root/model``), ``dataset(root, rows)`` (``root/train.jsonl``), ``write_config(root, name, **keys)`` and
  ``ktrain(*args)`` (a fresh process), from ``ktrain.testing.runs``; ``write_model_dir`` and
  ``write_chat_dataset`` write the model and data anywhere;
- ``ktrain.testing.triton_interpreter.converted_as_interpreted``: float8 as Triton's CPU interpreter converts
  to it, for tests of Triton kernels on a CPU (imported on its own, not by this package).

PYTEST_DONT_REWRITE: every check of the suite carries its own message, so this package need not be
rewritten, and a test module that imports it before declaring ``pytest_plugins`` gets no warning.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrain.testing.assets import write_chat_dataset, write_model_dir
from ktrain.testing.conformance import RunCache, ShardingConformance
from ktrain.testing.project import KtrainProject, install_entry_point, read_metrics
from ktrain.testing.recorder import ENV as RECORDER_ENV
from ktrain.testing.recorder import HookRecorder
from ktrain.testing.runs import dataset, ktrain, launch_problems, model_dir, write_config

__all__ = [
    "HookRecorder",
    "KtrainProject",
    "ShardingConformance",
    "dataset",
    "ktrain",
    "launch_problems",
    "model_dir",
    "read_metrics",
    "write_chat_dataset",
    "write_config",
    "write_model_dir",
]


@pytest.fixture(scope="session")
def ktrain_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local HF model folder: a two-layer Llama config (trained with ``random_init_weights``) and its tokenizer."""
    return write_model_dir(tmp_path_factory.mktemp("ktrain-model"))


@pytest.fixture(scope="session")
def ktrain_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """200 arithmetic chat rows in a jsonl file (``type: chat_template``)."""
    return write_chat_dataset(tmp_path_factory.mktemp("ktrain-data") / "train.jsonl")


@pytest.fixture
def ktrain_project(tmp_path: Path, ktrain_model_dir: Path, ktrain_dataset: Path) -> KtrainProject:
    """A folder in which to write configs over the tiny model and dataset, and run ``ktrain``."""
    return KtrainProject(tmp_path, ktrain_model_dir, ktrain_dataset)


@pytest.fixture
def ktrain_recorder(ktrain_project: KtrainProject) -> HookRecorder:
    """Records every hook call of the runs of ``ktrain_project`` (observers, transforms, collectors)."""
    folder = ktrain_project.root / "hook-calls"
    folder.mkdir()
    install_entry_point(ktrain_project.site, "ktrain-testing-recorder", "0", "hook_recorder", "ktrain.testing.recorder")
    ktrain_project.env[RECORDER_ENV] = str(folder)
    return HookRecorder(folder)


@pytest.fixture(scope="session")
def ktrain_run_cache(tmp_path_factory: pytest.TempPathFactory) -> RunCache:
    """The conformance suites' training runs, each made once per session."""
    return RunCache(tmp_path_factory.mktemp("ktrain-conformance"))
