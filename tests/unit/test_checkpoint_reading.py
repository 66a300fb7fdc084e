"""``read_checkpoint_state``: how commands (``ktrain export``, ``ktrain merge-lora``) read a checkpoint's model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from ktrain.config.activation import discover
from ktrain.config.report import ConfigError
from ktrain.run.checkpoints import read_checkpoint_state
from ktrain.run.manifest import MANIFEST, file_table

WEIGHTS = {"lm_head.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3)}


def _checkpoint(folder: Path, fmt: str = "ktrain-full") -> Path:
    """A committed checkpoint of ``fmt`` as the kernel writes one: its files, then the manifest listing them."""
    folder.mkdir()
    save_file(WEIGHTS, folder / "model.safetensors")
    record = {"format": fmt, "plugin_distribution": "ktrain-plugin-elsewhere", "files": file_table(folder)}
    (folder / MANIFEST).write_text(json.dumps(record))
    return folder


def test_reads_the_state_through_the_reader_of_its_format(tmp_path: Path) -> None:
    state = read_checkpoint_state(discover(), _checkpoint(tmp_path / "step-00000002"))
    assert state.keys() == WEIGHTS.keys() and torch.equal(state["lm_head.weight"], WEIGHTS["lm_head.weight"])


def test_a_damaged_file_is_named_before_any_reader_opens_it(tmp_path: Path) -> None:
    path = _checkpoint(tmp_path / "step-00000002")
    data = bytearray((path / "model.safetensors").read_bytes())
    data[-1] ^= 1
    (path / "model.safetensors").write_bytes(bytes(data))
    with pytest.raises(ConfigError, match=r"--checkpoint: .*cannot be read: .*model\.safetensors"):
        read_checkpoint_state(discover(), path)


def test_a_folder_without_manifest_or_of_an_unknown_format_is_refused(tmp_path: Path) -> None:
    bare = tmp_path / "bare"
    bare.mkdir()
    with pytest.raises(ConfigError, match=r"manifest\.json is missing"):
        read_checkpoint_state(discover(), bare)
    unknown = "'elsewhere-dcp' checkpoint of ktrain-plugin-elsewhere, which is not installed"
    with pytest.raises(ConfigError, match=unknown):
        read_checkpoint_state(discover(), _checkpoint(tmp_path / "step-00000004", fmt="elsewhere-dcp"))
