"""``ktrain bench CONFIG --nproc-per-node N``: the config's step timed on N ranks of this machine.

``ktrain.bench.command.bench`` checks the config for N ranks and writes the run's files into a temporary run
directory; this module starts the ranks through ``torch.distributed.run``, as ``ktrain run`` does (a rank
that fails stops the others, and the first error is named). Each rank builds the run as a training rank does, with the
plugins' layout (FSDP2, HSDP, tensor or context parallelism, DeepSpeed ZeRO), and times the same steps
as one process would (``ktrain.bench.measure.measure``), the ranks meeting before and after them. Synthetic
rows differ between the data-parallel ranks. Rank 0 writes the report, which the parent prints:
tokens/s counts every rank's tokens, and the report adds tokens/s per device; MFU is against the
peaks of all N devices. The plain Hugging Face peer, ``--profile`` and ``--lengths`` stay one-process
features.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from ktrain.bench.measure import measure

REPORT = "bench.json"


class RanksFailed(RuntimeError):
    """A rank of ``ktrain bench --nproc-per-node`` failed; the launcher printed which, and its error."""


def bench_ranks(run_dir: Path, config: str, nproc: int, *, steps: int, warmup: int, synthetic: bool) -> dict:
    """Time the step of the run files in ``run_dir`` on ``nproc`` ranks; return rank 0's report."""
    from ktrain.launcher import EXIT_OK, run_ranks

    worker = ["ktrain.bench.ranks", str(run_dir), config, "--steps", str(steps), "--warmup", str(warmup)]
    launch = argparse.Namespace(nnodes=1, max_restarts=0, rdzv_endpoint=None)
    if run_ranks(nproc, launch, worker + (["--synthetic"] if synthetic else [])) != EXIT_OK:
        raise RanksFailed(f"ktrain bench: a rank of {nproc} failed (above)")
    return json.loads((run_dir / REPORT).read_text(encoding="utf-8"))


def main(argv: list[str] | None = None) -> int:
    """One rank of ``ktrain bench --nproc-per-node``: build the run from RUN_DIR, time it, rank 0 writes the report."""
    from ktrain.run import distributed
    from ktrain.run.trainer import rank_run

    parser = argparse.ArgumentParser(prog="ktrain.bench.ranks")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("config", help="the config's path as the user gave it (for the report)")
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--synthetic", action="store_true")
    args = parser.parse_args(argv)
    run = rank_run(args.run_dir)
    try:
        report: dict[str, Any] = measure(
            run, args.config, steps=args.steps, warmup=args.warmup, synthetic=args.synthetic
        )
        if run.is_main:
            (args.run_dir / REPORT).write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    finally:
        distributed.shutdown()
    return 0
