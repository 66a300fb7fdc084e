"""The seed article's configs (../shared/compat/seed/): each passes `ktrain check`, or stops at once naming
the plugin distribution its keys need, when that plugin is not installed."""

from __future__ import annotations

import importlib.metadata
import re
from pathlib import Path

import pytest

from ktrain.cli import main
from tests.kit import QUICKSTART, REPO, model_dir

SEED = REPO.parent / "shared" / "compat" / "seed"
CONFIGS = sorted(SEED.glob("*.yaml"))
OVERRIDES = [
    "--set", f"base_model={QUICKSTART / 'model'}",
    "--set", f"datasets=[{{path: {QUICKSTART / 'data' / 'train.jsonl'}, type: chat_template}}]",
]  # fmt: skip


def _installed(dist: str) -> bool:
    try:
        importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def test_the_seed_configs_are_there() -> None:
    assert len(CONFIGS) == 8, f"expected the article's 8 configs in {SEED}"


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.stem)
def test_seed_config_checks_or_names_the_missing_plugin(config: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)  # output_dir: ./outputs/... stays in tmp_path
    if _installed("ktrain-plugin-deepspeed"):  # the article's user fetches deepspeed_configs/*.json first
        assert main(["fetch", "deepspeed_configs"]) == 0
    overrides = list(OVERRIDES)
    if "Qwen3DecoderLayer" in config.read_text():  # its FSDP block class is checked against the local model
        overrides[1] = f"base_model={model_dir(tmp_path, model_type='qwen3', architectures=['Qwen3ForCausalLM'])}"
    code = main(["check", str(config), *overrides])
    err = capsys.readouterr().err
    if code == 0:
        return
    assert code == 2
    problems = [line for line in err.splitlines() if line.startswith("  - ")]
    assert problems, err
    for line in problems:
        # a key of a plugin that is not installed, or a mesh dimension (tensor_parallel_size) only a plugin fills
        found = re.search(r"belong to the plugin (ktrain-plugin-[a-z]+), which is not installed|; install (\S+)$", line)
        assert found, f"{config.name}: a problem that is not a missing plugin: {line}"
        assert not _installed(found.group(1) or found.group(2))
