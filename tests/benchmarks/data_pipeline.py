"""Data benchmarks (not tests): tokenizing and packing alpaca samples, and training packed against padded.

    python tests/benchmarks/data_pipeline.py [--samples 100000] [--steps 16] [--only tokenize|train]

1. Tokenize ``--samples`` alpaca-style rows (a jsonl file written here, answer lengths drawn from a
   log-normal, like instruction data) with a byte-level BPE tokenizer of 8k tokens trained here, once
   with ktrain (``cache.build``: read, format, tokenize, mask, then pack into rows of 2048) and once with
   ``datasets.map`` on the same file and tokenizer (batched, one process, no cache), the plain way.
   Samples per second of each.
2. Training steps (forward, backward, AdamW; one thread) on 4000 alpaca rows of realistic length
   variation (character tokenizer: 5th to 95th percentile 163 to 406 tokens, median 247), 4 rows per
   micro-batch: padded rows (one sample each, padded to the longest of the micro-batch) against packed
   rows of 512 (SDPA with the block-diagonal mask, as on a CPU), steps of both alternating. Real (non-pad)
   tokens per second, the median over ``--steps`` steps after 2 warm-up steps; for the tiny model of
   tests/kit.py (hidden 64) and a wider one (hidden 512).
3. ``ktrain preprocess --check-only`` on the first 200 rows of the quickstart data (docs/data.md shows it).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

SYLLABLES = ["ka", "to", "ri", "men", "sa", "lo", "pre", "di", "ver", "un", "tion", "al", "ing", "ba", "co", "st"]


def vocabulary(rng: random.Random, size: int = 3000) -> tuple[list[str], list[float]]:
    """Pseudo-words of 1-4 syllables with Zipf frequencies, so that BPE meets text of realistic statistics."""
    words = ["".join(rng.choice(SYLLABLES) for _ in range(rng.randint(1, 4))) for _ in range(size)]
    return words, [1 / (rank + 1) for rank in range(size)]


def alpaca_rows(n: int, seed: int, scale: float = 1.0) -> list[dict]:
    rng = random.Random(seed)
    words, weights = vocabulary(rng)

    def text(mean_words: float) -> str:
        n = max(1, int(rng.lognormvariate(0, 0.8) * mean_words))
        return " ".join(rng.choices(words, weights, k=n))

    return [
        {
            "instruction": text(12 * scale),
            "input": text(10 * scale) if rng.random() < 0.4 else "",
            "output": text(40 * scale),
        }
        for _ in range(n)
    ]


def bpe_tokenizer(rows: list[dict], folder: Path) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=8192, special_tokens=["<pad>", "<s>", "</s>"])
    tokenizer.train_from_iterator((r["instruction"] + " " + r["output"] for r in rows[:20000]), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(folder)
    return folder


def tokenize_ktrain(data: Path, tokenizer_dir: Path, work: Path) -> tuple[float, str]:
    import transformers

    from ktrain.config.plan import prepare
    from ktrain.data import cache, packing

    config = {
        "base_model": str(tokenizer_dir),
        "datasets": [{"path": str(data), "type": "alpaca"}],
        "sequence_len": 2048,
        "output_dir": str(work / "out"),
    }
    (work / "tok.yaml").write_text(yaml.safe_dump(config))
    plan = prepare(work / "tok.yaml", world_size=1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    start = time.perf_counter()
    prepared = cache.build(plan.config, tokenizer, plan.formats)
    lengths = prepared.train.lengths
    rows = packing.pack(lengths, 2048, "ffd", 0)
    elapsed = time.perf_counter() - start
    share = packing.efficiency(lengths, rows, 2048)
    return len(lengths) / elapsed, f"{len(rows)} rows of 2048, efficiency {share:.1%}"


def tokenize_datasets_map(data: Path, tokenizer_dir: Path, work: Path) -> float:
    import datasets
    import transformers

    from ktrain.data.formats import ALPACA_PROMPT

    tokenizer = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    datasets.disable_caching()
    start = time.perf_counter()
    table = datasets.load_dataset("json", data_files=str(data), split="train", cache_dir=str(work / "hf"))

    def encode(batch: dict) -> dict:
        prompts = [
            ALPACA_PROMPT.format(
                with_input=", paired with an input that provides further context" if extra else "",
                instruction=instruction,
                input_block=f"### Input:\n{extra}\n\n" if extra else "",
            )
            for instruction, extra in zip(batch["instruction"], batch["input"], strict=True)
        ]
        prompt_ids = tokenizer(prompts, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(batch["output"], add_special_tokens=False)["input_ids"]
        ids, labels = [], []
        for p, a in zip(prompt_ids, answer_ids, strict=True):
            ids.append([tokenizer.bos_token_id, *p, *a, tokenizer.eos_token_id])
            labels.append([-100] * (len(p) + 1) + [*a, tokenizer.eos_token_id])
        return {"input_ids": ids, "labels": labels}

    table.map(encode, batched=True, remove_columns=table.column_names)
    return len(table) / (time.perf_counter() - start)


def step_rates(table: Any, rows: list[list[int]], packed: bool, model: Any, steps: int) -> Iterator[float]:
    """Real tokens per second of each training step (forward, backward, AdamW) over ``rows``."""
    import torch

    from ktrain.data.batches import BatchPlan, PlannedRows, collate, row_tokens

    data = PlannedRows(table, rows, BatchPlan(len(rows), 4, 1, 1, seed=0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for step in range(steps):
        (micro,) = data.step(step)[0]
        start = time.perf_counter()
        batch = collate(micro, 0, None, "sdpa" if packed else None)
        model(**batch).loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        yield sum(row_tokens(row) for row in micro) / (time.perf_counter() - start)


def train(work: Path, steps: int) -> None:
    import torch
    import transformers

    from ktrain.config.plan import prepare
    from ktrain.data import cache, packing
    from ktrain.data.batches import BatchPlan
    from ktrain.testing import model_dir, write_config

    small = alpaca_rows(4000, seed=1, scale=0.2)
    (work / "alpaca.jsonl").write_text("".join(json.dumps(r) + "\n" for r in small))
    model_dir(work, max_position_embeddings=512)
    config = write_config(work, "train.yaml", datasets=[{"path": str(work / "alpaca.jsonl"), "type": "alpaca"}])
    plan = prepare(config, ["sequence_len=512"], world_size=1)
    tokenizer = transformers.AutoTokenizer.from_pretrained(work / "model")
    table = cache.build(plan.config, tokenizer, plan.formats).train
    lengths = table.lengths
    padded_rows = [[i] for i in range(len(table))]
    packed_rows = packing.pack(lengths, 512, "ffd", 0)
    share = packing.efficiency(lengths, packed_rows, 512)
    print(f"{len(table)} samples: packed into {len(packed_rows)} rows of 512, efficiency {share:.1%}")
    padded_plan = BatchPlan(len(table), 4, 1, 1, seed=0)
    micro = [padded_plan.step_rows(step)[0][0] for step in range(2, steps + 2)]
    padded_share = sum(int(lengths[m].sum()) for m in micro) / sum(4 * int(lengths[m].max()) for m in micro)
    print(f"padded micro-batches of the measured steps: efficiency {padded_share:.1%}")
    torch.set_num_threads(1)
    for width in (64, 512):
        shape = {"hidden_size": width, "intermediate_size": 4 * width, "num_attention_heads": width // 16}
        model_config = transformers.AutoConfig.from_pretrained(model_dir(work, max_position_embeddings=512, **shape))
        model = transformers.AutoModelForCausalLM.from_config(model_config, attn_implementation="sdpa")
        model.config.use_cache = False
        rates: dict[bool, list[float]] = {False: [], True: []}
        runs = {
            packed: step_rates(table, packed_rows if packed else padded_rows, packed, model, steps + 2)
            for packed in (False, True)
        }
        for step in range(steps + 2):  # alternate, so that the load of the machine falls on both alike
            for packed, run in runs.items():
                rate = next(run)
                if step >= 2:
                    rates[packed].append(rate)
        padded, packed = statistics.median(rates[False]), statistics.median(rates[True])
        print(
            f"hidden {width}: padded {padded:,.0f} tokens/s, packed {packed:,.0f} tokens/s ({packed / padded:.2f}x), "
            f"median of {steps} steps each"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--only", choices=("tokenize", "train"))
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ktrain-data-bench-"))
    try:
        if args.only != "train":
            tokenize(work, args.samples)
        if args.only != "tokenize":
            train(work, args.steps)
            check_example(work)
    finally:
        shutil.rmtree(work)


def tokenize(work: Path, samples: int) -> None:
    rows = alpaca_rows(samples, seed=0)
    data = work / "alpaca.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    tokenizer_dir = bpe_tokenizer(rows, work / "bpe")
    rate, packed = tokenize_ktrain(data, tokenizer_dir, work)
    print(f"ktrain: {samples} alpaca samples tokenized and packed at {rate:,.0f} samples/s ({packed})")
    rate = tokenize_datasets_map(data, tokenizer_dir, work)
    print(f"datasets.map (batched, 1 process): {samples} samples tokenized at {rate:,.0f} samples/s")


def check_example(work: Path) -> None:
    """What docs/data.md shows: ``--check-only`` on the first 200 quickstart rows, packed into rows of 256."""
    from ktrain.testing import dataset, ktrain, write_config

    dataset(work, 200)
    config = write_config(work, "check.yaml", sequence_len=256, sample_packing=True)
    print(ktrain("preprocess", str(config), "--check-only").stdout)


if __name__ == "__main__":
    main()
