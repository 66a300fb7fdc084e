"""``ktrain bench --peer axolotl``: the YAML written for Axolotl and where it differs, the rows and tokenizer
written for it, the reading of its log, the refusals; on a GPU with Axolotl installed, a run beside ktrain."""

from __future__ import annotations

import importlib.util
import json
import types
from pathlib import Path

import pytest
import transformers

from ktrain.bench.axolotl_peer import (
    AxolotlFailed,
    axolotl_config,
    read_log,
    source_config,
    write_rows,
    write_tokenizer,
)
from ktrain.bench.rows import SyntheticRows
from ktrain.cli import main
from ktrain.testing import ktrain, model_dir, write_config
from tests.kit import REPO

# two steps of Axolotl 0.19's log as it prints them (a tqdm bar before each), and its summary line
LOG = """\
 25%|##5       | 1/4 [00:00<00:00,  6.46it/s]  {'loss': '12.17', 'grad_norm': '2.158', 'memory/max_allocated (GiB)': '41.5', 'tokens/trainable': 16384, 'epoch': '0.1'}
 50%|#####     | 2/4 [00:00<00:00,  6.46it/s]  {'loss': '12.1', 'grad_norm': '2.3', 'memory/max_allocated (GiB)': '67.19', 'tokens/train_per_sec_per_gpu': '30000', 'tokens/trainable': 32768, 'epoch': '0.2'}
 75%|#######5  | 3/4 [00:00<00:00,  6.46it/s]  {'loss': '11.9', 'grad_norm': '2.0', 'memory/max_allocated (GiB)': '67.19', 'tokens/train_per_sec_per_gpu': '43000', 'tokens/trainable': 49152, 'epoch': '0.3'}
100%|##########| 4/4 [00:00<00:00,  6.46it/s]  {'loss': '11.5', 'grad_norm': '1.9', 'memory/max_allocated (GiB)': '67.19', 'tokens/train_per_sec_per_gpu': '42000', 'tokens/trainable': 65536, 'epoch': '0.4'}
{'train_runtime': '1.5', 'train_loss': '11.9', 'memory/max_allocated (GiB)': '67.19', 'epoch': '0.4'}
"""  # noqa: E501


def test_the_yaml_for_axolotl_says_where_it_differs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The QLoRA config as written, a ktrain-only key added: Axolotl gets every key of its own unchanged,
    reinit_weights for random_init_weights, load_in_4bit for qlora, the rows and tokenizer written for it, and
    a line for each change."""
    monkeypatch.chdir(REPO)
    source = source_config("configs/bench/llama_8b_qlora.yaml", ["fused_linear_cross_entropy=true"])
    rows, tokenizer = tmp_path / "rows.jsonl", tmp_path / "tokenizer"
    written = axolotl_config(source, tmp_path, 11, rows, tokenizer)
    data = written.data
    for key in ("base_model", "adapter", "lora_r", "lora_alpha", "lora_target_linear", "sequence_len", "bf16"):
        assert data[key] == source[key], key
    assert "random_init_weights" not in data and "fused_linear_cross_entropy" not in data
    assert (data["reinit_weights"], data["load_in_4bit"], data["max_steps"], data["save_strategy"]) == (
        True,
        True,
        11,
        "no",
    )
    assert data["datasets"] == [{"path": str(rows), "ds_type": "json"}]
    assert data["tokenizer_config"] == str(tokenizer)
    assert Path(data["output_dir"]).parent == tmp_path
    assert written.differences == (
        "random_init_weights: true is written reinit_weights: true (Axolotl's name)",
        "fused_linear_cross_entropy: ktrain's key, not Axolotl's: left out",
        "load_in_4bit: true added (adapter: qlora; Axolotl quantizes the base only with it)",
        "datasets: the same random-token rows, written as a pre-tokenized jsonl",
        "tokenizer_config: a word-level tokenizer of the model's vocabulary (no tokenizer there)",
        "set for the timing: max_steps: 11, logging_steps: 1, save_strategy: no; output_dir and "
        "dataset_prepared_path in the run directory",
    )


def test_rows_and_tokenizer_written_for_axolotl(tmp_path: Path) -> None:
    """The ktrain side's random rows, one sample a line and every token labelled; a tokenizer of exactly the
    model's vocabulary whose special tokens are in it (Axolotl then adds none)."""
    config = types.SimpleNamespace(micro_batch_size=2, gradient_accumulation_steps=2, sequence_len=16, seed=0)
    train = SyntheticRows(50, config)
    write_rows(tmp_path / "rows.jsonl", train, 3)
    lines = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert len(lines) == 3 * 2 * 2
    assert lines[0]["input_ids"] == [int(t) for t in train.step(0)[0][0][0][0].input_ids]
    assert all(row["labels"] == row["input_ids"] and sum(row["attention_mask"]) == 16 for row in lines)
    write_tokenizer(tmp_path / "tokenizer", 50)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tmp_path / "tokenizer")
    assert len(tokenizer) == 50 and tokenizer.pad_token_id == tokenizer.eos_token_id == 0


def test_axolotls_log_is_read_after_the_warm_up() -> None:
    """The median tokens/s of the steps after the warm-up, the largest peak, the first and last step's loss."""
    timing = read_log(LOG, warmup=1)
    assert timing.tokens_per_s == 42000 and timing.peak_memory_gib == 67.19
    assert (timing.first_loss, timing.last_loss, timing.steps) == (12.17, 11.5, 4)
    assert read_log(LOG, warmup=4).tokens_per_s == 42000  # none after the warm-up: the last step's
    with pytest.raises(AxolotlFailed, match="no step"):
        read_log("Traceback (most recent call last):\n", warmup=1)


def test_peer_axolotl_refuses_synthetic_lengths_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["bench", str(REPO / "configs/bench/llama_1p5b.yaml"), "--peer", "axolotl", "--lengths", "8:16"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err == (
        "ktrain: --peer axolotl: Axolotl trains the config's datasets or synthetic rows: "
        "leave out --lengths and --pairs"
    )


@pytest.mark.skipif(importlib.util.find_spec("axolotl") is not None, reason="axolotl is installed here")
def test_peer_axolotl_refused_where_axolotl_is_not_installed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", str(REPO / "configs/bench/llama_1p5b.yaml"), "--peer", "axolotl"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "ktrain: --peer axolotl: axolotl is not installed here: pip install 'axolotl==0.19.*'"


@pytest.mark.gpu
@pytest.mark.skipif(importlib.util.find_spec("axolotl") is None, reason="needs axolotl (tools/device/axolotl_bench.sh)")
def test_axolotl_trains_the_same_yaml_beside_ktrain(tmp_path: Path) -> None:
    """Axolotl itself on a tiny model's YAML, then ktrain: both sides' tokens/s and peak memory from their own
    measures, the same random rows (the first losses agree), and the report's lines of what differs."""
    model_dir(tmp_path, vocab_size=100)
    config = write_config(tmp_path, datasets=[], bf16=True, sequence_len=64)
    out = tmp_path / "bench.json"
    done = ktrain("bench", str(config), "--steps", "3", "--warmup", "2", "--peer", "axolotl", "--json", str(out))
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(out.read_text())
    peer = report["peer"]
    assert peer["name"].startswith("peer axolotl: Axolotl ") and peer["tokens_per_s"] > 0
    assert peer["peak_memory_gib"] > 0 and report["ratio"] > 0
    assert peer["first_loss"] == pytest.approx(report["ktrain"]["first_loss"], rel=0.05)
    assert "Axolotl's YAML: datasets: the same random-token rows" in done.stdout
