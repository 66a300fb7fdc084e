"""``ktrain preprocess CONFIG [--check-only]``: tokenize once into the cache, or check the data without training;
and the same tokenizing pass that ``ktrain run`` makes on each machine before its ranks start (``before_ranks``).

``--check-only`` reads every sample and reports, without writing anything: samples per dataset, those
with a missing field (the first few by index, file and line), empty ones, those longer than
``sequence_len``, those with no trained token; length statistics; and one rendered sample with its
trained tokens between ``[[`` and ``]]``. It exits 2 when a dataset cannot be used as it is.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from ktrain.data import cache, packing, templates
from ktrain.data.examples import TokenTable
from ktrain.data.pipeline import cache_folder
from ktrain.data.reading import DataError

EXIT_OK, EXIT_BAD_INPUT = 0, 2


def _tokenizer(plan: Any) -> Any:
    import torch

    from ktrain.run.context import Run

    config = plan.config
    run = Run(
        plan=plan,
        output_dir=Path(config.output_dir).expanduser(),
        rank=0,
        local_rank=0,
        world_size=1,
        device=torch.device("cpu"),
        device_mesh=None,
        compute_dtype=torch.float32,
    )
    return chat_ready(plan.plugins.hook.ktrain_load_tokenizer(run=run), config)


def chat_ready(tokenizer: Any, config: Any) -> Any:
    """``tokenizer`` given the config's ``chat_template`` (or ``chat_template_jinja``), as a run trains and exports
    it; the cache's key holds the template, so every pass that names the cache does this first."""
    if config.chat_template or config.chat_template_jinja:
        name = templates.template_name(None, config)
        tokenizer.chat_template = templates.resolve(name, config, tokenizer, "chat_template")
    return tokenizer


@contextlib.contextmanager
def _building(folder: Path) -> Iterator[None]:
    """Hold an exclusive lock on the folder above the cache ``folder`` (no file of its own is left there):
    machines sharing ``dataset_prepared_path`` tokenize one after the other, and the later ones find the
    cache built."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    handle = os.open(folder.parent, os.O_RDONLY)
    try:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
    finally:
        os.close(handle)  # releases the lock


def before_ranks(run_dir: Path, world_size: int) -> None:
    """Tokenize the datasets of the run in ``run_dir`` (of ``world_size`` ranks) into their cache, when it is
    missing, before any rank starts (``ktrain run`` on each machine): the ranks then only memory-map it, so
    a long tokenization never keeps a rank from the process group's collectives past their timeout.
    Raises ``DataError`` on bad data."""
    from ktrain.config.plan import prepare

    plan = prepare(run_dir / "config.yaml", world_size=world_size, with_defaults=True)  # as the ranks read it
    config = plan.config
    if not (config.datasets or config.test_datasets):
        return  # pretraining_dataset streams
    tokenizer = _tokenizer(plan)
    folder = cache_folder(config, run_dir, tokenizer, plan.formats)
    with _building(folder):
        if not cache.exists(folder):
            print(f"ktrain: tokenizing the datasets into {folder}", flush=True)
            cache.write(folder, cache.build(config, tokenizer, plan.formats))


def render(tokenizer: Any, ids: Any, labels: Any) -> str:
    """The sample's text, its trained tokens between ``[[`` and ``]]``."""
    out, run, trained = [], [], None
    for token, label in zip(ids, labels, strict=True):
        now = bool(label != -100)
        if now != trained and run:
            text = tokenizer.decode(run)
            out.append(f"[[{text}]]" if trained else text)
            run = []
        trained = now
        run.append(int(token))
    if run:
        text = tokenizer.decode(run)
        out.append(f"[[{text}]]" if trained else text)
    return "".join(out)


def _length_line(name: str, table: TokenTable) -> str:
    lengths = table.lengths
    if not len(lengths):
        return f"{name}: no samples"
    trained = table.trained()
    p50, p95 = np.percentile(lengths, [50, 95])
    return (
        f"{name}: {len(lengths)} samples, {int(lengths.sum())} tokens ({int(trained.sum())} trained); length min "
        f"{int(lengths.min())}, median {p50:.0f}, mean {lengths.mean():.1f}, p95 {p95:.0f}, max {int(lengths.max())}"
    )


def check(plan: Any, tokenizer: Any) -> int:
    config = plan.config
    prepared = cache.build(config, tokenizer, plan.formats, strict=False)
    bad = False
    for stats in prepared.stats:
        print(stats.describe())
        for problem in stats.problems:
            print(f"  error: {problem}")
            bad = True
        if stats.untrained:
            print(f"  warning: {stats.untrained} samples have no trained token; a run drops them")
        if stats.truncated:
            print(f"  warning: {stats.truncated} samples are longer than sequence_len {config.sequence_len}")
    if config.datasets:
        print(_length_line("datasets", prepared.train))
    if prepared.test is not None:
        print(_length_line("test_datasets", prepared.test))
    if config.sample_packing and len(prepared.train):
        lengths = prepared.train.lengths
        rows = packing.pack(lengths, config.sequence_len, config.sample_packing_method, config.seed)
        share = packing.efficiency(lengths, rows, config.sequence_len)
        print(f"packing: {len(lengths)} samples into {len(rows)} rows of {config.sequence_len}, efficiency {share:.1%}")
    if config.pretraining_dataset:
        from ktrain.data.stream import TextStream

        rows = TextStream(config, tokenizer).rows()
        first = next(rows)
        print(f"pretraining_dataset: streams; the first row holds {len(first)} document pieces")
    if len(prepared.train):
        sample = prepared.train[0]
        print("first sample, trained tokens between [[ and ]]:")
        print(render(tokenizer, sample.input_ids, sample.labels))
    print("data: problems found; fix them before training" if bad else "data: ok")
    return EXIT_BAD_INPUT if bad else EXIT_OK


def preprocess_cli(config_path: str, overrides: list[str], check_only: bool) -> int:
    """Build (or find) the cache of ``config_path``'s datasets; with ``check_only`` only check them."""
    from ktrain.config.plan import prepare

    plan = prepare(config_path, overrides, with_defaults=True)
    config = plan.config
    for problem in plan.warnings:
        print(f"ktrain: warning: {problem}", file=sys.stderr)
    try:
        tokenizer = _tokenizer(plan)
        if check_only:
            return check(plan, tokenizer)
        if not config.dataset_prepared_path:
            print("ktrain: dataset_prepared_path: set it to the folder the cache goes to", file=sys.stderr)
            return EXIT_BAD_INPUT
        if not (config.datasets or config.test_datasets):
            print("ktrain: pretraining_dataset streams and is never cached; nothing to prepare", file=sys.stderr)
            return EXIT_BAD_INPUT
        folder = cache_folder(config, Path(config.output_dir), tokenizer, plan.formats)
        if cache.exists(folder):
            print(f"cache hit: {folder}")
            return EXIT_OK
        prepared = cache.build(config, tokenizer, plan.formats)
        cache.write(folder, prepared)
        for stats in prepared.stats:
            print(stats.describe())
        print(f"cache miss: tokenized into {folder}")
        return EXIT_OK
    except DataError as e:
        print(f"ktrain: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
