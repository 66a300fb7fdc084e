"""Data through the real CLI: packed training on 2 ranks, exact resume, the pretraining stream, the cache.

Every training run goes through ``ktrain`` in a subprocess, as a user would start it; ``ktrain
preprocess`` runs through the CLI's entry point in this process.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from ktrain.cli import main
from ktrain.testing import dataset, ktrain, model_dir, read_metrics, write_config


def _cut_after(run_dir: Path, step: int, last: int) -> None:
    """Make ``run_dir`` look like a run killed after ``step`` was saved: later checkpoint, records and model gone."""
    shutil.rmtree(run_dir / "checkpoints" / f"step-{last:08d}")
    shutil.rmtree(run_dir / "final")
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    kept = [line for line in lines if json.loads(line)["step"] <= step]
    (run_dir / "metrics.jsonl").write_text("\n".join(kept) + "\n")


@pytest.fixture
def root(tmp_path: Path) -> Path:
    model_dir(tmp_path, max_position_embeddings=256, attention_dropout=0.0)
    dataset(tmp_path, 300)
    return tmp_path


def test_packed_two_ranks_match_one_and_resume_is_exact(root: Path) -> None:
    """Packed rows of 128 tokens (about 3 samples each): 2 ranks x 1 micro-batch = 1 rank x 2, rel 1e-5 (fp32)."""
    keys = dict(sample_packing=True, sequence_len=128, micro_batch_size=2, max_steps=4, val_set_size=12, eval_steps=4)
    keys["dataset_prepared_path"] = str(root / "prepared")
    two = write_config(root, "two.yaml", gradient_accumulation_steps=1, output_dir=str(root / "two"), **keys)
    done = ktrain("run", str(two), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr
    assert all(line in done.stdout for line in ("tokenizing the datasets into", "packed into", "efficiency"))
    assert done.stdout.count(": tokenizing the datasets into") == 1, done.stdout  # rank 0 built, rank 1 read
    built = sorted(p.name for p in (root / "prepared").iterdir())
    assert len(built) == 1 and not built[0].startswith(".tmp"), built
    keys.update(output_dir=str(root / "one"), save_steps=2)
    one = write_config(root, "one.yaml", gradient_accumulation_steps=2, **keys)
    done = ktrain("run", str(one))
    assert done.returncode == 0, done.stderr
    assert "cache hit" in done.stdout
    a, b = read_metrics(root / "one"), read_metrics(root / "two")
    assert a.keys() == b.keys() == {1, 2, 3, 4}
    for step in a:
        assert b[step] == pytest.approx(a[step], rel=1e-5), step
    eval_one, eval_two = (read_metrics(root / run, "eval_loss")[4] for run in ("one", "two"))
    assert eval_two == pytest.approx(eval_one, rel=1e-5)
    whole = read_metrics(root / "one")
    _cut_after(root / "one", 2, 4)
    resumed = ktrain("run", str(one), "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert read_metrics(root / "one") == whole


def test_pretraining_stream_on_two_ranks_resumes_exactly(root: Path) -> None:
    rng = random.Random(0)
    words = ["alpha", "beta", "gamma", "delta", "tokens", "stream", "of", "text"]
    docs = [" ".join(rng.choice(words) for _ in range(rng.randint(2, 40))) for _ in range(200)]
    (root / "raw.jsonl").write_text("".join(json.dumps({"content": d}) + "\n" for d in docs))
    config = write_config(
        root,
        datasets=[],
        pretraining_dataset=[{"path": str(root / "raw.jsonl"), "field": "content"}],
        test_datasets=[{"path": str(root / "train.jsonl"), "type": "chat_template", "split": "train"}],
        sequence_len=64,
        micro_batch_size=2,
        max_steps=4,
        save_steps=2,
        eval_steps=4,
    )
    done = ktrain("run", str(config), "--nproc-per-node", "2")
    assert done.returncode == 0, done.stderr
    assert "pretraining_dataset streamed" in done.stdout
    whole = read_metrics(root / "out")
    assert whole.keys() == {1, 2, 3, 4} and 4 in read_metrics(root / "out", "eval_loss")
    _cut_after(root / "out", 2, 4)
    resumed = ktrain("run", str(config), "--resume", "--nproc-per-node", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert read_metrics(root / "out") == whole


def test_preprocess_cache_hit_and_miss_and_check_only(root: Path, capsys: pytest.CaptureFixture) -> None:
    """``ktrain preprocess`` through the CLI's entry point, in this process (no training, no ranks)."""
    config = write_config(root, dataset_prepared_path=str(root / "prepared"), sequence_len=40)

    def preprocess(*args: str) -> tuple[int, str]:
        code = main(["preprocess", str(config), *args])
        return code, capsys.readouterr().out

    code, out = preprocess()
    assert code == 0 and "cache miss" in out, out
    code, out = preprocess()
    assert code == 0 and "cache hit" in out, out
    lines = (root / "train.jsonl").read_text().splitlines()
    lines[5] = lines[5].replace('"assistant", "content": "', '"assistant", "content": "1')
    (root / "train.jsonl").write_text("\n".join(lines) + "\n")
    code, out = preprocess()
    assert code == 0 and "cache miss" in out, out
    assert len(list((root / "prepared").iterdir())) == 2

    code, out = preprocess("--check-only")
    assert code == 0 and "data: ok" in out and "[[" in out and "length min" in out, out
    bad_rows = [
        {"messages": [{"role": "user", "content": "What is 1+1?"}, {"role": "assistant", "content": "2"}]},
        {"messages": [{"role": "user", "content": "no answer"}]},
        {"conversation": []},
        {"messages": [{"role": "user", "content": "long " * 20}, {"role": "assistant", "content": "x"}]},
    ]
    (root / "bad.jsonl").write_text("".join(json.dumps(r) + "\n" for r in bad_rows))
    code, out = preprocess("--check-only", "--set", f"datasets.0.path={root / 'bad.jsonl'}")
    assert code == 2, out
    assert "4 samples, 1 kept" in out and "2 without a trained token" in out and "1 invalid" in out, out
    assert "sample 2 (" in out and "bad.jsonl line 3) has no field 'messages'" in out, out
    assert "1 truncated to sequence_len" in out
    assert "[[2<|im_end|>]]" in out
