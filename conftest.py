"""Fixtures shared by the kernel's tests: a tiny local model folder and a tiny chat dataset."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local HF model folder (config.json and random weights of a tiny Llama) that ``base_model`` can point at."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("tiny-llama")
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    LlamaForCausalLM(config).save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_chat_jsonl(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A two-row jsonl file in the ``chat_template`` format (a ``messages`` list per row)."""
    path = tmp_path_factory.mktemp("data") / "chat.jsonl"
    rows = [
        {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"}]},
        {"messages": [{"role": "user", "content": "What is 3+5?"}, {"role": "assistant", "content": "8"}]},
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    return path


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
