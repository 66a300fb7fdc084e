"""min_sample_len (Axolotl's): a sample of fewer tokens is dropped before truncation and counted."""

from __future__ import annotations

import json
from pathlib import Path

import transformers

from ktrain.config.plan import prepare
from ktrain.data import cache
from ktrain.data.preprocess import chat_ready
from ktrain.testing import model_dir, write_config


def test_samples_under_min_sample_len_are_dropped_and_counted(tmp_path: Path) -> None:
    model_dir(tmp_path)
    rows = [
        {"messages": [{"role": "user", "content": " ".join(["word"] * n)}, {"role": "assistant", "content": "ok"}]}
        for n in (1, 5, 20, 40)
    ]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")
    lengths = {}
    for least in (None, 30):
        plan = prepare(write_config(tmp_path, f"{least}.yaml", min_sample_len=least, sequence_len=256))
        tokenizer = chat_ready(transformers.AutoTokenizer.from_pretrained(tmp_path / "model"), plan.config)
        prepared = cache.build(plan.config, tokenizer, plan.formats)
        lengths[least] = list(prepared.train.lengths)
        stats = prepared.stats[0]
    assert len(lengths[None]) == 4 and min(lengths[None]) < 30
    long_ones = [n for n in lengths[None] if n >= 30]
    assert lengths[30] == long_ones and stats.short == 4 - len(long_ones) > 0
    assert "shorter than min_sample_len" in stats.describe()
