"""group_by_length: the shuffled rows of an epoch grouped by length (as transformers' LengthGroupedSampler),
so micro-batches pad less; every row still trained once an epoch, the order still set by seed and epoch."""

from __future__ import annotations

import json
import random
import types
from pathlib import Path

import transformers

from ktrain.config.plan import prepare
from ktrain.data import pipeline
from ktrain.data.batches import BatchPlan, row_tokens
from ktrain.data.preprocess import chat_ready
from ktrain.testing import model_dir, write_config


def _rows_of_many_lengths(path: Path, count: int) -> None:
    rng = random.Random(0)
    rows = [
        {
            "messages": [
                {"role": "user", "content": " ".join(["word"] * rng.randint(1, 40))},
                {"role": "assistant", "content": "ok"},
            ]
        }
        for _ in range(count)
    ]
    path.write_text("".join(json.dumps(row) + "\n" for row in rows), encoding="utf-8")


def _padding_and_rows(root: Path, grouped: bool) -> tuple[int, list[int]]:
    """Padding tokens over one epoch's micro-batches, and the rows the epoch trains (by their index)."""
    config = write_config(
        root, f"{grouped}.yaml", group_by_length=grouped, sequence_len=256, output_dir=str(root / f"out-{grouped}")
    )
    plan = prepare(config)
    tokenizer = chat_ready(transformers.AutoTokenizer.from_pretrained(root / "model"), plan.config)
    run = types.SimpleNamespace(
        config=plan.config,
        plan=plan,
        tokenizer=tokenizer,
        output_dir=root / f"out-{grouped}",
        rank=0,
        local_rank=0,
        mesh=types.SimpleNamespace(dp_size=1),
    )
    train = pipeline.load(run, lambda: None).train
    padding, seen = 0, []
    for step in range(train.steps_per_epoch):
        for micro in train.step(step)[0]:
            lengths = [row_tokens(row) for row in micro]
            padding += max(lengths) * len(lengths) - sum(lengths)
        seen += [i for micro in train.plan.step_rows(step)[0] for i in micro]
    return padding, seen


def test_micro_batches_pad_far_less_and_every_row_is_trained_once(tmp_path: Path) -> None:
    model_dir(tmp_path)
    _rows_of_many_lengths(tmp_path / "train.jsonl", 64)
    plain, plain_rows = _padding_and_rows(tmp_path, grouped=False)
    grouped, grouped_rows = _padding_and_rows(tmp_path, grouped=True)
    assert grouped < plain / 3, (grouped, plain)  # mega-batches of 4 steps here: a quarter of the padding
    assert sorted(grouped_rows) == sorted(plain_rows) == list(range(64))


def test_the_longest_row_comes_first_and_the_order_is_the_seed_s() -> None:
    lengths = tuple(random.Random(1).randint(1, 500) for _ in range(1000))
    plan = BatchPlan(1000, micro=2, accum=2, dp_size=2, seed=3, lengths=lengths)
    order = plan.order(0)
    assert lengths[order[0]] == max(lengths) and sorted(order) == list(range(1000))
    assert order == BatchPlan(1000, 2, 2, 2, 3, lengths).order(0) != plan.order(1)


def test_packing_makes_group_by_length_moot_with_a_note(tmp_path: Path) -> None:
    model_dir(tmp_path)
    _rows_of_many_lengths(tmp_path / "train.jsonl", 8)
    plan = prepare(write_config(tmp_path, group_by_length=True, sample_packing=True))
    assert any("group_by_length" in str(note) and "sample_packing" in str(note) for note in plan.warnings)
