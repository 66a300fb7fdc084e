"""Axolotl's low-memory optimizer names train for real through the CLI on CPU, with the library's states.

Each run trains 6 steps with a checkpoint at step 3: the loss falls, ``optimizer.pt`` holds bitsandbytes'
8-bit states (``state1`` as uint8) or torchao's quantized state tensors, and a resume from step 3 of a copy
repeats the losses and the final weights to the bit. One name of each library trains: every name goes through
the same ``runtime.build`` and the same checkpoint path, and a torchao run costs about a minute on CPU.
``ktrain check`` importing neither torch nor the libraries is tests/unit/test_config_phase.py's.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ktrain.config.axolotl import missing_optimizer
from ktrain.config.axolotl_keys import OPTIMIZER_PLUGINS
from ktrain.testing import KtrainProject, read_metrics, write_chat_dataset, write_model_dir
from ktrain_optimizers.keys import MUON, NAMES
from ktrain_optimizers.runtime import allow_torchao_states


def bnb_8bit(state: dict) -> bool:
    """A parameter's bitsandbytes state (saved under ``__bnb_optimizer_quant_state__``) is 8-bit."""
    return state.get("__bnb_optimizer_quant_state__", state)["state1"].dtype == torch.uint8


# name -> (the class name rank 0 prints, a test of one parameter's state that the library's 8/4-bit states pass)
CASES = {
    "lion_8bit": ("bitsandbytes.optim.Lion8bit", bnb_8bit),  # no epsilon: the one branch of runtime.build
    "adamw_torch_4bit": ("torchao.optim.AdamW4bit", lambda state: type(state["exp_avg"]).__name__ == "OptimState4bit"),
    "muon": ("ktrain_optimizers.muon.MuonAdamW", lambda state: "momentum_buffer" in state),  # Muon's own state
}


@pytest.fixture
def project(tmp_path: Path) -> KtrainProject:
    return KtrainProject(
        tmp_path, write_model_dir(tmp_path / "model"), write_chat_dataset(tmp_path / "chat.jsonl", count=48)
    )


def test_the_kernel_catalogue_names_this_plugin_for_its_names() -> None:
    assert set(OPTIMIZER_PLUGINS["ktrain-plugin-optimizers"]) == {*NAMES, MUON}
    message = missing_optimizer("adamw_bnb_8bit")
    assert message is not None and message.startswith("'adamw_bnb_8bit' is registered by ktrain-plugin-optimizers")
    assert "pip install -e " in message and message.rstrip("`").endswith("plugins/optimizers")
    assert missing_optimizer("adamw_nonesuch") is None


@pytest.mark.parametrize("name", list(CASES))
def test_trains_with_the_library_state_and_resumes_exactly(project: KtrainProject, name: str) -> None:
    printed, is_library_state = CASES[name]
    keys = {"optimizer": name, "max_steps": 6, "save_steps": 3, "weight_decay": 0.01}
    out = project.train(project.config(name="first", **keys))
    losses = read_metrics(out)
    assert sorted(losses) == list(range(1, 7)) and losses[6] < losses[1]
    allow_torchao_states()  # as the plugin does on the ranks
    state = torch.load(out / "checkpoints" / "step-00000003" / "optimizer.pt", weights_only=True)["state"]
    assert any(is_library_state(s) for s in state.values()), name

    again = project.root / "again"
    shutil.copytree(out, again)
    shutil.rmtree(again / "checkpoints" / "step-00000006")
    shutil.rmtree(again / "final")
    lines = (again / "metrics.jsonl").read_text().splitlines()
    (again / "metrics.jsonl").write_text("\n".join(line for line in lines if json.loads(line)["step"] <= 3) + "\n")
    resumed = project.ktrain("run", str(project.config(name="again", output_dir=str(again), **keys)), "--resume")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"optimizers: {name} is {printed}" in resumed.stdout and "resumed from" in resumed.stdout
    assert read_metrics(again) == losses
    assert (again / "final" / "model.safetensors").read_bytes() == (out / "final" / "model.safetensors").read_bytes()


def test_a_paged_optimizer_on_cpu_ranks_runs_unpaged_with_a_warning(project: KtrainProject) -> None:
    done = project.ktrain("run", str(project.config(optimizer="paged_adamw_8bit", max_steps=2)))
    assert done.returncode == 0, done.stderr[-3000:]
    assert sorted(read_metrics(project.root / "runs" / "run")) == [1, 2]
    assert "optimizer: paged_adamw_8bit pages its states only on CUDA" in done.stdout + done.stderr
