"""``ktrain bench --nproc-per-node``: the step timed on several ranks, here two CPU ranks over gloo.

The report counts the tokens of every data-parallel rank, gives tokens/s per device and MFU against both
peaks, and its first loss is the token mean over the global batch, which the test computes again with
plain transformers from the same seed and the same random rows.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import torch
import transformers

from ktrain.bench.rows import SyntheticRows
from ktrain.cli import main
from ktrain.testing import model_dir, write_config
from tests.integration.test_bench import bench_json

MICRO, ACCUMULATION, SEQUENCE, SEED, VOCAB = 2, 2, 32, 7, 100


def _first_loss_over_the_ranks(model_folder: Path, dp_size: int) -> float:
    """Step 0's rows of every data-parallel rank through the same randomly initialized model, one batch."""
    config = types.SimpleNamespace(
        micro_batch_size=MICRO, gradient_accumulation_steps=ACCUMULATION, sequence_len=SEQUENCE, seed=SEED
    )
    rows = SyntheticRows(VOCAB, config, dp_size=dp_size).step(0)
    ids = torch.tensor([list(row[0].input_ids) for rank in rows for micro in rank for row in micro], dtype=torch.long)
    assert ids.shape == (dp_size * ACCUMULATION * MICRO, SEQUENCE)
    torch.manual_seed(SEED)
    model_config = transformers.AutoConfig.from_pretrained(model_folder)
    model = transformers.AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa")
    with torch.no_grad():
        return float(model(input_ids=ids, labels=ids).loss)


@pytest.mark.parametrize(
    ("layout", "dp_size"),
    [({}, 2), ({"fsdp_version": 2}, 2), ({"fsdp_version": 2, "tensor_parallel_size": 2}, 1)],
    ids=["ddp", "fsdp2", "tp"],
)
def test_bench_on_two_ranks_counts_every_data_parallel_rank_s_rows(layout: dict, dp_size: int, tmp_path: Path) -> None:
    """Under tensor parallelism both ranks train the same rows: one data-parallel rank, counted once. That
    config is given no --nproc-per-node: its mesh sizes ask for 2 ranks, and bench starts them."""
    folder = model_dir(tmp_path, vocab_size=VOCAB)
    config = write_config(
        tmp_path, datasets=[], sequence_len=SEQUENCE, micro_batch_size=MICRO,
        gradient_accumulation_steps=ACCUMULATION, seed=SEED, **layout,
    )  # fmt: skip
    ranks = () if "tensor_parallel_size" in layout else ("--nproc-per-node", "2")
    report, stdout = bench_json(tmp_path, str(config), "--steps", "2", "--warmup", "1", *ranks)
    assert (report["ranks"], report["data_parallel"]) == (2, dp_size), report
    side = report["ktrain"]
    steps_tokens = side["tokens_per_s"] * side["step_s"]  # the tokens of one step: both ranks' rows
    assert steps_tokens == pytest.approx(dp_size * ACCUMULATION * MICRO * SEQUENCE)
    assert side["tokens_per_s_per_device"] == pytest.approx(side["tokens_per_s"] / 2)
    peaks = 2 * report["peak_tflops"] * 1e12
    assert side["mfu"] == pytest.approx(side["tokens_per_s"] * side["flops_per_token"] / peaks)
    assert side["first_loss"] == pytest.approx(_first_loss_over_the_ranks(folder, dp_size), rel=1e-4)
    assert "on 2 ranks of CPU" in stdout and "tokens/s per device" in stdout, stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--nproc-per-node", "2", "--peer", "hf"), "--peer run in one process, and this run has 2 ranks"),
        (("--nproc-per-node", "0"), "--nproc-per-node must be at least 1"),
    ],
)
def test_bench_ranks_refuse_one_process_flags(
    args: tuple[str, ...], message: str, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """Refused before any rank starts: in this process, as the CLI's own answer (exit 2, one line)."""
    model_dir(tmp_path, vocab_size=VOCAB)
    config = write_config(tmp_path, datasets=[], sequence_len=SEQUENCE)
    code = main(["bench", str(config), "--steps", "1", *args])
    err = capsys.readouterr().err
    assert code == 2 and message in err and "Traceback" not in err, err[-2000:]
