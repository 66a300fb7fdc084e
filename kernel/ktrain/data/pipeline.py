"""From the config to the rows a run trains and evaluates on: cache, split, packing, or the pretraining stream.

One rank per machine (local rank 0) builds the cache when it is missing; every rank waits for it and
memory-maps it. Without ``dataset_prepared_path`` the cache lives in the run directory (``prepared/``),
so a resumed run does not tokenize again.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import attrs
import numpy as np
import torch.distributed as dist

from ktrain.data import cache, packing
from ktrain.data.batches import BatchPlan, PlannedRows
from ktrain.data.examples import Example, TokenTable, split_eval
from ktrain.data.stream import StreamRows, TextStream


@attrs.define
class TrainData:
    """What the loop needs: training rows by step, evaluation rows, whether each is packed, and a summary."""

    train: PlannedRows | StreamRows
    eval_rows: list[list[Example]]
    train_packed: bool
    eval_packed: bool
    summary: list[str]


def cache_folder(config: Any, output_dir: Path, tokenizer: Any, formats: Any) -> Path:
    """The cache's folder; in a run, rank 0 alone reads the data files to hash them and tells the others."""
    root = Path(config.dataset_prepared_path).expanduser() if config.dataset_prepared_path else output_dir / "prepared"
    key = [cache.cache_key(config, tokenizer, formats) if not dist.is_initialized() or dist.get_rank() == 0 else None]
    if dist.is_initialized():
        dist.broadcast_object_list(key, src=0)
    return root / key[0]


def rows_of(table: TokenTable, indices: np.ndarray, packed: bool, config: Any) -> tuple[list[list[int]], str | None]:
    """Rows of sample indices: one sample each, or packed into ``sequence_len`` (with a line saying how well)."""
    if not packed:
        return [[int(i)] for i in indices], None
    lengths = table.lengths[indices]
    bins = packing.pack(lengths, config.sequence_len, config.sample_packing_method, config.seed)
    rows = [[int(indices[j]) for j in b] for b in bins]
    share = packing.efficiency(lengths, bins, config.sequence_len)
    return rows, f"{len(indices)} samples packed into {len(rows)} rows of {config.sequence_len}: efficiency {share:.1%}"


def load(run: Any, barrier: Any) -> TrainData:
    """The run's data; ``barrier()`` waits for every rank (the cache is built by local rank 0 only)."""
    config, tokenizer = run.config, run.tokenizer
    summary: list[str] = []
    prepared = None
    if config.datasets or config.test_datasets:
        folder = cache_folder(config, run.output_dir, tokenizer, run.plan.formats)
        hit = cache.exists(folder)
        if not hit and run.local_rank == 0:
            print(f"rank {run.rank}: tokenizing the datasets into {folder}", flush=True)
            cache.write(folder, cache.build(config, tokenizer, run.plan.formats))
        barrier()
        prepared = cache.read(folder)
        summary.append(f"data: {'cache hit' if hit else 'tokenized into'} {folder}")
        for stats in prepared.stats:
            summary.append(f"  {stats.describe()}")
            if stats.untrained:
                summary.append(
                    f"  warning: {stats.where}: {stats.untrained} samples have no trained token and were dropped"
                )
    eval_packed = config.sample_packing if config.eval_sample_packing is None else config.eval_sample_packing
    micro, accum, dp = config.micro_batch_size, config.gradient_accumulation_steps, run.mesh.dp_size
    eval_rows: list[list[Example]] = []
    if prepared is not None and (prepared.test is not None or config.val_set_size):
        table = prepared.test if prepared.test is not None else prepared.train
        held = np.arange(len(table)) if prepared.test is not None else split_eval(len(prepared.train), config)[1]
        rows, line = rows_of(table, held, eval_packed, config)
        eval_rows = [[table[i] for i in row] for row in rows]
        summary += [f"  evaluation: {line}"] if line else []
    if config.pretraining_dataset:
        train: PlannedRows | StreamRows = StreamRows(TextStream(config, tokenizer), micro, accum, dp, config.max_steps)
        summary.append(f"data: pretraining_dataset streamed in packed rows of {config.sequence_len} tokens")
        return TrainData(train, eval_rows, True, eval_packed, summary)
    assert prepared is not None  # the config check asks for datasets or pretraining_dataset
    if prepared.test is not None:
        train_idx = np.arange(len(prepared.train))
    else:
        train_idx = split_eval(len(prepared.train), config)[0]
    rows, line = rows_of(prepared.train, train_idx, config.sample_packing, config)
    summary.append(f"data: {len(train_idx)} training samples, {len(eval_rows)} evaluation rows")
    summary += [f"  packing: {line}"] if line else []
    grouped = config.group_by_length and not config.sample_packing  # packed rows are all about sequence_len long
    lengths = tuple(int(prepared.train.lengths[row[0]]) for row in rows) if grouped else ()
    plan = BatchPlan(len(rows), micro, accum, dp, config.seed, lengths)
    return TrainData(PlannedRows(prepared.train, rows, plan), eval_rows, config.sample_packing, eval_packed, summary)
