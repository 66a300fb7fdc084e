"""``ktrain bench CONFIG``: check the config, write the run's files into a temporary run directory, time the
step in this process or on N ranks (``ktrain.bench.ranks``), print the report."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

from ktrain.bench import axolotl_peer
from ktrain.bench.measure import measure
from ktrain.bench.ranks import RanksFailed, bench_ranks
from ktrain.bench.report import describe_report
from ktrain.bench.rows import Lengths, Pairs
from ktrain.config import fast_defaults
from ktrain.config.plan import Plan, load_plugins_and_config, prepare
from ktrain.config.report import ConfigError
from ktrain.run import distributed
from ktrain.run.directory import write_run_files
from ktrain.run.trainer import rank_run

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

TORCHTITAN_REFUSED = (
    "not timed: torchtitan 0.3.0, its latest release, pins the PyTorch nightly it was cut from (its README: "
    "each release pins the nightly torch and torchao), and the device has the released torch 2.11; "
    'docs/performance.md, "Fast by default, beside Axolotl and torchtitan"'
)
"""Why ``--peer torchtitan`` is refused."""


def bench_plan(
    config: str, overrides: list[str], run_dir: Path, synthetic: bool, world_size: int | None = 1
) -> tuple[Plan, bool]:
    """The checked plan for ``world_size`` ranks (None: what the mesh sizes ask) in ``run_dir``, and whether
    the rows are synthetic."""
    _, loaded = load_plugins_and_config(config, overrides)
    has_data = bool(loaded.datasets or loaded.pretraining_dataset)
    # without data, the check's demand for datasets is met by an entry that nothing reads: the run directory
    placeholder = [f"datasets=[{{path: {json.dumps(str(run_dir))}}}]"]
    extra = [f"output_dir={run_dir}"] + ([] if has_data else placeholder)
    cuda = torch.cuda.is_available()  # the keys' GPU defaults are resolved as ``ktrain run`` resolves them
    capability = min(torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())) if cuda else None
    plan = prepare(
        config,
        [*overrides, *extra],
        world_size=world_size,
        device="cuda" if cuda else None,
        capability=capability,
        with_defaults=True,
    )
    for choice in fast_defaults.applied(plan.config):
        print(f"ktrain: {choice.line()}", flush=True)
    for problem in plan.warnings:
        print(f"ktrain: warning: {problem}", file=sys.stderr)
    return plan, synthetic or not has_data


def bench(
    config: str,
    overrides: list[str],
    *,
    steps: int,
    warmup: int,
    synthetic: bool,
    peer: str | None,
    peer_variant: str,
    profile_to: Path | None = None,
    lengths: Lengths | None = None,
    nproc: int | None = None,
    pairs: Pairs | None = None,
) -> dict[str, Any]:
    """Time the config's step on ``nproc`` ranks (None: as many as its mesh sizes ask, else 1), and first the
    peer's (one process only); return the report ``ktrain bench`` prints."""
    with tempfile.TemporaryDirectory(prefix="ktrain-bench-") as tmp:
        run_dir = Path(tmp)
        synthetic = synthetic or bool(lengths or pairs)
        plan, synthetic = bench_plan(config, overrides, run_dir, synthetic, world_size=nproc)
        _check_pairs(plan.config, peer, pairs)
        ranks = plan.mesh.world_size
        given = (("--peer", peer), ("--profile", profile_to), ("--lengths", lengths), ("--pairs", pairs))
        one_process = [flag for flag, value in given if value]
        if ranks > 1 and one_process:
            raise ConfigError.single(
                "--nproc-per-node", f"{', '.join(one_process)} run in one process, and this run has {ranks} ranks"
            )
        write_run_files(run_dir, plan)
        if ranks > 1:
            return bench_ranks(run_dir, config, ranks, steps=steps, warmup=warmup, synthetic=synthetic)
        if lengths and not lengths[2]:  # the peer's micro batch defaults to the config's
            lengths = (lengths[0], lengths[1], plan.config.micro_batch_size)
        axolotl = None
        if peer == "axolotl":  # first, in its own process, before this one holds the GPU
            axolotl = axolotl_peer.time_axolotl(config, overrides, plan.config, run_dir, warmup, steps, synthetic)
            peer = None
        run = rank_run(run_dir)  # the one rank, set up as a training rank is
        try:
            return measure(
                run, config, steps=steps, warmup=warmup, synthetic=synthetic, peer=peer, peer_variant=peer_variant,
                profile_to=profile_to, lengths=lengths, pairs=pairs, axolotl=axolotl,
            )  # fmt: skip
        finally:
            distributed.shutdown()


def _axolotl_refusal(lengths: Lengths | None, pairs: Pairs | None) -> str | None:
    """Why ``--peer axolotl`` cannot run here (None: it can): it trains the config's data or synthetic rows of
    ``sequence_len`` tokens, and needs Axolotl."""
    if lengths or pairs:
        return "Axolotl trains the config's datasets or synthetic rows: leave out --lengths and --pairs"
    if not axolotl_peer.installed():
        return "axolotl is not installed here: pip install 'axolotl==0.19.*'"
    return None


def _check_pairs(config: Any, peer: str | None, pairs: Pairs | None) -> None:
    """``--pairs`` goes with a preference config (``rl``) and fits ``sequence_len``; ``--peer trl`` times TRL's
    DPOTrainer, so it needs ``rl: dpo`` and ``--pairs``."""
    method = getattr(config, "rl", None)  # the preference plugin's key: absent when that plugin is not installed
    if pairs and method is None:
        raise ConfigError.single("--pairs", "times preference pairs: the config needs rl (e.g. rl: dpo)")
    if pairs and sum(pairs) > config.sequence_len:
        raise ConfigError.single(
            "--pairs", f"a prompt and an answer of {sum(pairs)} tokens exceed sequence_len ({config.sequence_len})"
        )
    if peer == "trl" and method != "dpo":
        raise ConfigError.single("--peer", f"trl times TRL's DPOTrainer: the config needs rl: dpo (it has {method})")
    if peer == "trl" and not pairs:
        raise ConfigError.single("--peer", "trl times synthetic pairs: give --pairs PROMPT:ANSWER")


def _pairs(text: str | None, lengths: Lengths | None) -> Pairs | None:
    """``--pairs PROMPT:ANSWER`` as two token counts (None without it)."""
    if text is None:
        return None
    if lengths:
        raise ValueError("--pairs and --lengths are two kinds of synthetic rows: give one")
    parts = text.split(":")
    if len(parts) != 2 or not all(part.isdigit() and int(part) >= 1 for part in parts):
        raise ValueError(f"--pairs: expected PROMPT:ANSWER, two whole numbers of at least 1 (got {text!r})")
    return int(parts[0]), int(parts[1])


def _lengths(text: str | None, peer_micro: int | None) -> Lengths | None:
    """``--lengths MEDIAN:MAX`` and ``--peer-micro-batch`` as a ``Lengths`` (None without ``--lengths``)."""
    if text is None:
        if peer_micro is not None:
            raise ValueError("--peer-micro-batch goes with --lengths (the peer otherwise takes the ktrain side's rows)")
        return None
    parts = text.split(":")
    if len(parts) != 2 or not all(part.isdigit() for part in parts) or not 2 <= int(parts[0]) <= int(parts[1]):
        raise ValueError(f"--lengths: expected MEDIAN:MAX, two whole numbers with 2 <= MEDIAN <= MAX (got {text!r})")
    if peer_micro is not None and peer_micro < 1:
        raise ValueError("--peer-micro-batch must be at least 1")
    return int(parts[0]), int(parts[1]), peer_micro or 0


def bench_cli(args: argparse.Namespace) -> int:
    """Run ``ktrain bench`` for parsed ``args``; return the exit code."""
    from ktrain.data.reading import DataError

    if args.peer == "torchtitan":
        print(f"ktrain: --peer torchtitan: {TORCHTITAN_REFUSED}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.steps < 1 or args.warmup < 0:
        print("ktrain: --steps must be at least 1 and --warmup at least 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        lengths = _lengths(args.lengths, args.peer_micro_batch)
        pairs = _pairs(args.pairs, lengths)
    except ValueError as e:
        print(f"ktrain: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    refused = _axolotl_refusal(lengths, pairs) if args.peer == "axolotl" else None
    if refused:
        print(f"ktrain: --peer axolotl: {refused}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        print("ktrain: --nproc-per-node must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        report = bench(
            args.config,
            args.overrides,
            steps=args.steps,
            warmup=args.warmup,
            synthetic=args.synthetic,
            peer=args.peer,
            peer_variant=args.peer_variant,
            profile_to=args.profile,
            lengths=lengths,
            nproc=args.nproc_per_node,
            pairs=pairs,
        )
    except (RanksFailed, axolotl_peer.AxolotlFailed) as e:
        print(e, file=sys.stderr)
        return EXIT_FAILED
    except (DataError, FileNotFoundError) as e:
        print(f"ktrain: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(describe_report(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return EXIT_OK
