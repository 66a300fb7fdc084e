"""Fixtures shared by the repository's tests, over ``ktrain.testing``'s tiny model and data: a model folder,
a two-row chat dataset and a config writer for tests that check configs in process."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from ktrain.testing import write_chat_dataset, write_model_dir


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``ktrain.testing``'s tiny Llama folder with seeded random weights saved in it (``base_model`` loads them)."""
    return write_model_dir(tmp_path_factory.mktemp("tiny-llama"), weights=True)


@pytest.fixture(scope="session")
def tiny_chat_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-row jsonl file of ``ktrain.testing``'s arithmetic chat rows (``type: chat_template``)."""
    return write_chat_dataset(tmp_path_factory.mktemp("data") / "chat.jsonl", count=2)


@pytest.fixture
def tiny_config(tmp_path: Path, tiny_model_dir: Path, tiny_chat_jsonl: Path) -> Callable[..., Path]:
    """A function that writes ``tmp_path/config.yaml``, a run over the tiny model and data with ``keys`` on top,
    and returns its path (the model has random weights)."""

    def write(**keys: object) -> Path:
        data = {
            "base_model": str(tiny_model_dir),
            "datasets": [{"path": str(tiny_chat_jsonl), "type": "chat_template"}],
            "output_dir": str(tmp_path / "out"),
            **keys,
        }
        path = tmp_path / "config.yaml"
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        return path

    return write


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip tests marked ``gpu`` where there is no CUDA device, with a reason the summary prints."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU: run `pytest -m gpu` on the device machine")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
