"""``ktrain bench --pairs`` and ``--peer trl``: the preference bench configs check, and bad arguments are refused
before anything is built (exit 2, one line naming the flag)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ktrain.bench.command import bench_plan
from ktrain.cli import main
from tests.kit import REPO

DPO = "configs/bench/llama_1p5b_dpo.yaml"


@pytest.mark.parametrize("name", ["llama_1p5b_dpo.yaml", "llama_1p5b_dpo_lora.yaml"])
def test_dpo_bench_configs_check(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The DPO bench configs are one-rank DPO runs of the 1.5B Llama shape, timed on synthetic pairs."""
    monkeypatch.chdir(REPO)
    plan, synthetic = bench_plan(f"configs/bench/{name}", [], tmp_path, synthetic=True)
    assert synthetic and plan.mesh.world_size == 1
    assert (plan.config.rl, plan.config.sequence_len, plan.config.micro_batch_size, plan.config.bf16) == (
        "dpo",
        1024,
        4,
        True,
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((DPO, "--peer", "trl"), "--peer: trl times synthetic pairs: give --pairs PROMPT:ANSWER"),
        ((DPO, "--pairs", "8"), "--pairs: expected PROMPT:ANSWER, two whole numbers of at least 1"),
        ((DPO, "--pairs", "8:0"), "--pairs: expected PROMPT:ANSWER, two whole numbers of at least 1"),
        ((DPO, "--pairs", "8:8", "--lengths", "8:16"), "--pairs and --lengths are two kinds of synthetic rows"),
        ((DPO, "--pairs", "1000:100"), "--pairs: a prompt and an answer of 1100 tokens exceed sequence_len (1024)"),
        ((DPO, "--pairs", "8:8", "--peer", "trl", "--set", "rl=ipo"), "--peer: trl times TRL's DPOTrainer"),
        (("configs/bench/llama_1p5b.yaml", "--pairs", "8:8"), "--pairs: times preference pairs: the config needs rl"),
    ],
)
def test_bench_refuses_bad_pairs(
    args: tuple[str, ...], message: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    """Refused before any model is built: in this process, as the CLI's own answer (exit 2, no traceback)."""
    monkeypatch.chdir(REPO)
    code = main(["bench", *args, "--steps", "1"])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err[-2000:]
