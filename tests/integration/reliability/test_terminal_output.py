"""What reaches the terminal during ``ktrain run``: ktrain's own lines; the libraries' warnings, logging and
progress bars, and an error's traceback, in the rank's log (``output_dir/logs/rank-N.log``)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ktrain.testing import dataset, ktrain, model_dir, write_config

TWO = ("--nproc-per-node", "2")
NOISE = ("FutureWarning", "UserWarning", "DeprecationWarning", "Setting accelerator", "it/s]", "Traceback")
"""What a library prints (DeepSpeed's import on a run without it included) and a progress bar's rate."""


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path)
    dataset(tmp_path, 32)
    return tmp_path


NOISY_MODEL = '''"""A Llama whose code, run from the checkpoint, warns, logs and prints as libraries do."""

import logging
import warnings

from transformers import LlamaForCausalLM


class NoisyLlamaForCausalLM(LlamaForCausalLM):
    def forward(self, *args, **kwargs):
        warnings.warn("the checkpoint's code warns", FutureWarning)
        logging.getLogger(__name__).warning("the checkpoint's code logs")
        print("the checkpoint's code prints")
        return super().forward(*args, **kwargs)
'''
"""A library's voices in a rank: the model code shipped with a checkpoint, which transformers imports."""


def _noisy_model(root: Path) -> None:
    """``root/model`` runs ``NoisyLlamaForCausalLM`` under ``trust_remote_code``."""
    (root / "model" / "modeling_noisy.py").write_text(NOISY_MODEL)
    config = json.loads((root / "model" / "config.json").read_text())
    config["auto_map"] = {"AutoModelForCausalLM": "modeling_noisy.NoisyLlamaForCausalLM"}
    (root / "model" / "config.json").write_text(json.dumps(config))


def _assert_quiet(terminal: str) -> None:
    found = [noise for noise in NOISE if noise in terminal]
    assert not found, f"{found} on the terminal:\n{terminal[-3000:]}"


def test_a_two_rank_ddp_lora_run_shows_ktrains_lines_and_logs_the_libraries(root: Path) -> None:
    """The model's code warns, logs and prints on each rank: in the rank's log, not on the terminal.
    The kernel's own warning (FlexAttention on a CPU), given by each rank alike, is one line, rank 0's."""
    _noisy_model(root)
    keys = dict(adapter="lora", lora_r=4, lora_alpha=8, lora_target_modules=["q_proj", "v_proj"])
    config = write_config(
        root, max_steps=2, micro_batch_size=2, attn_implementation="flex_attention", trust_remote_code=True, **keys
    )
    done = ktrain("run", str(config), *TWO)
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-3000:]
    _assert_quiet(terminal)
    assert "step 2/2 loss" in terminal and "model written to" in terminal
    assert terminal.count("ktrain: warning: attn_implementation: FlexAttention has no backward pass") == 1, terminal
    logs = root / "out" / "logs"
    assert "the checkpoint's code" not in terminal, terminal[-3000:]
    for rank in (0, 1):
        log = (logs / f"rank-{rank}.log").read_text()
        assert "FutureWarning: the checkpoint's code warns" in log, log
        assert "the checkpoint's code logs" in log and "the checkpoint's code prints" in log, log


def test_a_two_rank_fsdp_run_does_not_import_deepspeed(root: Path) -> None:
    """The export's unwrapping (accelerate's) imported DeepSpeed when installed, which said "Setting accelerator";
    transformers' bar writing the model goes to the log."""
    config = write_config(root, max_steps=2, micro_batch_size=2, fsdp_version=2, fsdp_config={})
    done = ktrain("run", str(config), *TWO)
    terminal = done.stdout + done.stderr
    assert done.returncode == 0, terminal[-3000:]
    _assert_quiet(terminal)
    log = (root / "out" / "logs" / "rank-0.log").read_text()
    assert "Writing model shards" in log and "Setting accelerator" not in log, log


def test_one_rank_shows_its_warning_and_one_line_for_an_error_whose_traceback_is_logged(root: Path) -> None:
    """The kernel's own warning (FlexAttention on a CPU) reaches the terminal; an error is one line naming the log."""
    config = write_config(root, max_steps=1, attn_implementation="flex_attention")
    done = ktrain("run", str(config), env={"KTRAIN_FAULT": "forward:1:0:raise"})
    terminal = done.stdout + done.stderr
    assert done.returncode == 1, terminal[-3000:]
    assert "ktrain: warning: attn_implementation: FlexAttention has no backward pass on a CPU" in done.stderr
    log = root / "out" / "logs" / "rank-0.log"
    assert "error: InjectedFault: injected fault at forward, step 1, rank 0\n" in done.stderr
    assert f"its output and traceback: {log}" in done.stderr
    _assert_quiet(terminal)
    assert "Traceback" in log.read_text() and "injected fault at forward" in log.read_text()
