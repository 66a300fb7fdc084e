"""``ktrain bench CONFIG``: the training step of a config, timed on one device, beside plain Hugging Face.

The run is built as ``ktrain run`` builds it: the same plugins and hooks load, wrap, parallelize and
shard the model and build the optimizer and schedule, and every step is the loop's own
``Trainer._train_step``. Left out are the loop's observers (logging, evaluation, checkpoints, export,
the ``on_*`` hooks). One process (world size 1), or N ranks with ``--nproc-per-node`` (``ktrain.bench_ranks``,
each rank calling ``measure``); the run directory is a temporary folder, removed at the end, so nothing
is written to ``output_dir``.

Rows: random tokens, ``micro_batch_size`` rows of ``sequence_len`` tokens per micro-batch, every token
trained, with ``--synthetic`` or when the config has no ``datasets`` (the config check's demand for
``datasets`` is then met by a placeholder entry that nothing reads, and no tokenizer is loaded);
with ``--lengths MEDIAN:MAX`` random-token samples of log-normal lengths (``ktrain.bench_rows``), packed
into rows under ``sample_packing`` and given to the peer one a row, padded to the longest of its micro-batch
(``--peer-micro-batch``): tokens/s then counts real tokens, not padding; otherwise the config's data,
tokenized into the temporary run directory (or ``dataset_prepared_path``).

With ``--peer hf`` the plain Hugging Face step (``ktrain.bench_peer``) runs first, on the same rows, and
is freed before the ktrain side is built: it runs first because plugins such as Liger patch the
architecture's modules for the whole process. Each side's peak memory is the GPU's peak allocation from
the start of its build to the end of its timed steps.

MFU counts ``6 · N + 12 · layers · hidden · sequence_len`` training FLOPs a token (N: the parameters
outside the input embeddings, ZeRO-3 partitions counted whole) against the device's dense bf16 peak
(``ktrain.run.metrics.PEAK_TFLOPS``; ``KTRAIN_PEAK_TFLOPS`` overrides; none on a CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import attrs
import torch

from ktrain.bench_device import DeviceState
from ktrain.bench_rows import LENGTH_SIGMA, FetchedRows, SampleRows, SyntheticRows, padding, variable_length_rows
from ktrain.bench_timing import Timed, Timeline, reset_memory, run_steps
from ktrain.config.report import ConfigError
from ktrain.data import pipeline, templates
from ktrain.data.examples import Example
from ktrain.data.pipeline import TrainData
from ktrain.data.stream import StreamRows
from ktrain.resolve import Plan, load_plugins_and_config, prepare
from ktrain.run import distributed
from ktrain.run.context import Run
from ktrain.run.metrics import flops_per_token, non_embedding_params, peak_flops
from ktrain.run.trainer import Trainer, rank_run
from ktrain.run_dir import write_run_files

PLACEHOLDER_DATASETS = "datasets=[{path: ktrain-bench-synthetic-rows}]"
EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
Lengths = tuple[int, int, int]
"""``--lengths``: the median and the longest sample, and the peer's micro batch."""


class TimedEngine:
    """The run's engine, unchanged, with timeline marks after each backward and after the optimizer step."""

    def __init__(self, engine: Any, timeline: Timeline):
        self.engine = engine
        self.timeline = timeline

    def __getattr__(self, name: str) -> Any:
        return getattr(self.engine, name)

    def backward(self, loss: torch.Tensor) -> None:
        self.engine.backward(loss)
        self.timeline.mark("forward_backward")

    def step(self) -> torch.Tensor | float:
        norm = self.engine.step()
        self.timeline.mark("optimizer")
        return norm


class BenchTrainer(Trainer):
    """The kernel's trainer, built in two stages (data, then the model and engine) and driven step by step.

    The stages are ``Trainer._load`` and the start of ``Trainer.fit`` cut apart, so that the peer can run
    on the data before the ktrain model exists, and so that synthetic rows need no tokenizer.
    """

    def __init__(self, run: Run):
        super().__init__(run)
        self.timeline = Timeline(run.device)
        self.peer_rows: SampleRows | None = None

    def load_data(self, synthetic: bool, steps: int, lengths: Lengths | None = None) -> TrainData:
        """Synthetic rows (of ``lengths`` when given, the peer's then in ``self.peer_rows``), or the config's data
        (for ``steps`` steps) through the tokenizer and the data pipeline."""
        run, config = self.run, self.config
        if synthetic or lengths:
            import transformers

            source = config.base_model_config or config.base_model
            vocab = transformers.AutoConfig.from_pretrained(source, trust_remote_code=config.trust_remote_code)
            if lengths:
                ours, self.peer_rows = variable_length_rows(vocab.vocab_size, config, *lengths, steps=steps)
                return TrainData(ours, [], config.sample_packing, False, [])
            return TrainData(SyntheticRows(vocab.vocab_size, config, run.mesh.dp_size), [], False, False, [])
        run.tokenizer = run.hook.ktrain_load_tokenizer(run=run)
        if config.chat_template or config.chat_template_jinja:
            name = templates.template_name(None, config)
            run.tokenizer.chat_template = templates.resolve(name, config, run.tokenizer, "chat_template")
        data = pipeline.load(run, distributed.barrier)
        print("\n".join(data.summary), flush=True)
        if data.train.steps_per_epoch == 0:
            raise ConfigError.single("datasets", "fewer training rows than one global batch: nothing to time")
        if isinstance(data.train, StreamRows):
            data.train = FetchedRows(data.train, steps)
        return data

    def build(self, data: TrainData, total_steps: int) -> None:
        """Load, wrap, parallelize and shard the model through the plugins, as a run does."""
        model = self.load_model()
        self.dp_rank = self.run.dp_rank()
        self.plan = data.train
        self.build_engine(model, total_steps)
        self.engine = TimedEngine(self.engine, self.timeline)
        self.engine.train(True)

    def _to_device(self, rows: list[list[Example]], packed: bool) -> dict[str, Any]:
        batch = super()._to_device(rows, packed)
        self.timeline.mark("data")
        return batch

    def bench_step(self, step: int, data: TrainData) -> tuple[float, int]:
        """One optimizer step of the loop; returns (this rank's share of the token-mean loss, global input tokens)."""
        loss_sum, trained, inputs = self._train_step(step, data)
        return loss_sum / max(trained, 1), inputs


def bench_plan(
    config: str, overrides: list[str], run_dir: Path, synthetic: bool, world_size: int | None = 1
) -> tuple[Plan, bool]:
    """The checked plan for ``world_size`` ranks (None: what the mesh sizes ask) in ``run_dir``, and whether
    the rows are synthetic."""
    _, loaded = load_plugins_and_config(config, overrides)
    has_data = bool(loaded.datasets or loaded.pretraining_dataset)
    extra = [f"output_dir={run_dir}"] + ([] if has_data else [PLACEHOLDER_DATASETS])
    plan = prepare(config, [*overrides, *extra], world_size=world_size, with_defaults=True)
    for problem in plan.warnings:
        print(f"ktrain: warning: {problem}", file=sys.stderr)
    return plan, synthetic or not has_data


def _side(
    name: str, timed: Timed, flops: float, peak: float | None, held: float | None, padded: float
) -> dict[str, Any]:
    tokens_per_s = timed.tokens / timed.seconds
    return {
        "name": name,
        "padding": padded,
        "tokens_per_s": tokens_per_s,
        "mfu": tokens_per_s * flops / peak if peak else None,
        "peak_memory_gib": timed.peak_memory_gib,
        "held_before_gib": held,
        "step_s": timed.seconds / timed.steps,
        "split_s": {part: seconds / timed.steps for part, seconds in timed.parts.items()},
        "flops_per_token": flops,
        "first_loss": timed.first_loss,
        "last_loss": timed.last_loss,
        "device_state": attrs.asdict(timed.device_state) if timed.device_state else None,
    }


def _rows(synthetic: bool, lengths: Lengths | None, packed: bool) -> str:
    """What the report says of the rows."""
    if lengths:
        median, cap, peer_micro = lengths
        ours = "packed into rows of sequence_len" if packed else "one a row"
        return (
            f"random tokens, samples of log-normal lengths (median {median}, sigma {LENGTH_SIGMA:g}, at most {cap}), "
            f"{ours}; the peer's one a row, {peer_micro} a micro-batch, padded to the longest"
        )
    return "synthetic random tokens" if synthetic else "the config's datasets"


def _header(config: str, run: Run, rows: str, warmup: int, steps: int, peak: float | None) -> dict[str, Any]:
    import transformers

    from ktrain import __version__

    cfg = run.config
    return {
        "config": config,
        "device": torch.cuda.get_device_name(run.device) if run.device.type == "cuda" else "CPU",
        "versions": {"ktrain": __version__, "torch": torch.__version__, "transformers": transformers.__version__},
        "plugins": sorted({a.plugin.distribution for a in run.plan.plugins.activations if not a.default}),
        "rows": rows,
        "micro_batch_size": cfg.micro_batch_size,
        "sequence_len": cfg.sequence_len,
        "gradient_accumulation_steps": cfg.gradient_accumulation_steps,
        "warmup_steps": warmup,
        "timed_steps": steps,
        "ranks": run.world_size,
        "data_parallel": run.mesh.dp_size,
        "mesh": run.mesh.describe(),
        "peak_tflops": peak / 1e12 if peak else None,
        "peer": None,
        "ratio": None,
    }


def _profile(trainer: BenchTrainer, data: TrainData, first: int, path: Path) -> None:
    """Three more steps under ``torch.profiler``, to ``path``: a Chrome trace where its name ends in
    ``.json`` or ``.json.gz`` (tools/device/trace_summary.py reads it), otherwise the ops that took the
    most device time (CPU time on a CPU)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = trainer.run.device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        for i in range(first, first + 3):
            trainer.bench_step(i, data)
        if cuda:
            torch.cuda.synchronize()
    if path.name.endswith((".json", ".json.gz")):
        prof.export_chrome_trace(str(path))
        return
    key = "self_cuda_time_total" if cuda else "self_cpu_time_total"
    path.write_text(prof.key_averages().table(sort_by=key, row_limit=40, max_name_column_width=70) + "\n")


def _time_ktrain(
    trainer: BenchTrainer, data: TrainData, warmup: int, steps: int, profile_to: Path | None = None
) -> tuple[Timed, dict[str, Any]]:
    """Build the ktrain side and time it; return the timing and the terms of its FLOPs a token."""
    start = time.perf_counter()
    trainer.build(data, warmup + steps + (3 if profile_to else 0))
    print(f"ktrain side built in {time.perf_counter() - start:.1f} s (loaded, wrapped, sharded)", flush=True)
    timed = run_steps(lambda i: trainer.bench_step(i, data), warmup, steps, trainer.timeline)
    if profile_to is not None:
        _profile(trainer, data, warmup + steps, profile_to)
    model = trainer.engine.model
    model_config = getattr(model, "config", None)
    terms = {
        "non_embedding_params": non_embedding_params(model),
        "frozen_params": non_embedding_params(model, frozen=True),
        "layers": getattr(model_config, "num_hidden_layers", 0),
        "hidden": getattr(model_config, "hidden_size", 0),
        "sequence_len": trainer.config.sequence_len,
        "flops_per_token": flops_per_token(model, trainer.config.sequence_len),
    }
    return timed, terms


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
) -> dict[str, Any]:
    """Time the config's step on ``nproc`` ranks (None: as many as its mesh sizes ask, else 1), and first the
    peer's (one process only); return the report ``ktrain bench`` prints."""
    with tempfile.TemporaryDirectory(prefix="ktrain-bench-") as tmp:
        run_dir = Path(tmp)
        plan, synthetic = bench_plan(config, overrides, run_dir, synthetic or bool(lengths), world_size=nproc)
        ranks = plan.mesh.world_size
        one_process = [
            flag for flag, given in (("--peer", peer), ("--profile", profile_to), ("--lengths", lengths)) if given
        ]
        if ranks > 1 and one_process:
            raise ConfigError.single(
                "--nproc-per-node", f"{', '.join(one_process)} run in one process, and this run has {ranks} ranks"
            )
        write_run_files(run_dir, plan)
        if ranks > 1:
            from ktrain.bench_ranks import bench_ranks

            return bench_ranks(run_dir, config, ranks, steps=steps, warmup=warmup, synthetic=synthetic)
        if lengths and not lengths[2]:  # the peer's micro batch defaults to the config's
            lengths = (lengths[0], lengths[1], plan.config.micro_batch_size)
        run = rank_run(run_dir)  # the one rank, set up as a training rank is
        try:
            return measure(
                run, config, steps=steps, warmup=warmup, synthetic=synthetic, peer=peer, peer_variant=peer_variant,
                profile_to=profile_to, lengths=lengths,
            )  # fmt: skip
        finally:
            distributed.shutdown()


def measure(
    run: Run,
    config: str,
    *,
    steps: int,
    warmup: int,
    synthetic: bool,
    peer: str | None = None,
    peer_variant: str = "mixed",
    profile_to: Path | None = None,
    lengths: Lengths | None = None,
) -> dict[str, Any]:
    """Time the run's step on this rank, all ranks together (and first the peer's, in one process only).

    tokens/s counts the tokens of every rank; MFU divides by the ranks' peaks; the peak memory is the
    largest of any rank, the losses are the token means over the global batch. Each rank times its own
    wall clock between the barriers; ``ktrain.bench_ranks`` reports rank 0's.
    """
    from ktrain.bench_peer import describe, run_peer

    cfg = run.config
    total = warmup + steps + (3 if profile_to else 0)
    timed_steps = range(warmup, warmup + steps)
    peak = peak_flops(run.device)
    report = _header(config, run, _rows(synthetic, lengths, cfg.sample_packing), warmup, steps, peak)
    pad_to = cfg.sequence_len if cfg.pad_to_sequence_len else None
    trainer = BenchTrainer(run)
    data = trainer.load_data(synthetic, total, lengths)
    if peer:
        # with --lengths the peer pads each micro-batch to its longest sample, as a user's collator does
        rows, packed, peer_pad_to = (
            (trainer.peer_rows, False, None) if trainer.peer_rows else (data.train, data.train_packed, pad_to)
        )
        held = reset_memory(run.device)
        timed, flops = run_peer(
            cfg, rows, packed, run.pad_id, peer_pad_to, run.device, run.compute_dtype, peer_variant, warmup, steps
        )
        name = f"peer {peer}: {describe(peer_variant, run.compute_dtype)}"
        report["peer"] = _side(name, timed, flops, peak, held, padding(rows, timed_steps, peer_pad_to))
    held = reset_memory(run.device)
    torch.manual_seed(cfg.seed)
    timed, report["formula"] = _time_ktrain(trainer, data, warmup, steps, profile_to)
    if timed.peak_memory_gib is not None:
        (timed.peak_memory_gib,) = distributed.all_reduce_max([timed.peak_memory_gib], run.device)
    # each rank's loss is its share of the global token mean; ranks holding copies (tensor parallel) count once
    losses = distributed.all_reduce_sum([timed.first_loss, timed.last_loss], run.device)
    timed.first_loss, timed.last_loss = (loss / run.mesh.copies for loss in losses)
    flops = report["formula"]["flops_per_token"]
    all_peaks = peak * run.world_size if peak else None
    report["ktrain"] = _side("ktrain", timed, flops, all_peaks, held, padding(data.train, timed_steps, pad_to))
    report["ktrain"]["tokens_per_s_per_device"] = report["ktrain"]["tokens_per_s"] / run.world_size
    report["device_state_missing"] = trainer.timeline.monitor.why_not
    if report["peer"]:
        report["ratio"] = report["ktrain"]["tokens_per_s"] / report["peer"]["tokens_per_s"]
    return report


def _fmt_gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.1f}"


def describe_report(report: dict[str, Any]) -> str:
    """The report as the command prints it."""
    f = report["formula"]
    tokens = report["micro_batch_size"] * report["sequence_len"] * report["gradient_accumulation_steps"]
    tokens *= report["data_parallel"]
    ranks = report["ranks"]
    where = report["device"] if ranks == 1 else f"{ranks} ranks of {report['device']} ({report['mesh']})"
    peak = f"{report['peak_tflops']:g} TFLOP/s" if report["peak_tflops"] else None
    frozen = f" - 2 x {f['frozen_params']:,} of them frozen (no weight gradient)" if f["frozen_params"] else ""
    lines = [
        f"ktrain bench {report['config']} on {where} (ktrain {report['versions']['ktrain']}, "
        f"torch {report['versions']['torch']}, transformers {report['versions']['transformers']})",
        f"plugins beside the kernel's: {', '.join(report['plugins']) or 'none'}",
        f"rows: {report['rows']}; micro batch {report['micro_batch_size']} x sequence {report['sequence_len']} "
        f"x accumulation {report['gradient_accumulation_steps']}"
        + (f" x {report['data_parallel']} data-parallel ranks" if report["data_parallel"] > 1 else "")
        + f" = {tokens:,} tokens a step; "
        f"{report['warmup_steps']} warm-up + {report['timed_steps']} timed steps",
        f"MFU = tokens/s x FLOPs a token / peak; FLOPs a token = 6 x {f['non_embedding_params']:,} parameters "
        f"outside the embeddings{frozen} + 12 x {f['layers']} layers x {f['hidden']} hidden "
        f"x {f['sequence_len']} sequence "
        f"= {f['flops_per_token']:.4g}; peak " + (peak or "unknown for this device: no MFU (set KTRAIN_PEAK_TFLOPS)"),
        "",
        f"{'':44} {'tokens/s':>10} {'MFU':>6} {'peak GiB':>9} {'step ms':>9} {'data ms':>8} {'fwd+bwd ms':>10} "
        f"{'optim ms':>9} {'loss@1':>7} {'padding':>7}",
    ]
    for side in (report["ktrain"], report["peer"]):
        if side is None:
            continue
        mfu = f"{side['mfu']:.1%}" if side["mfu"] is not None else "n/a"
        split = side["split_s"]
        lines.append(
            f"{side['name'][:44]:44} {side['tokens_per_s']:>10,.0f} {mfu:>6} {_fmt_gib(side['peak_memory_gib']):>9} "
            f"{side['step_s'] * 1e3:>9.1f} {split['data'] * 1e3:>8.1f} {split['forward_backward'] * 1e3:>10.1f} "
            f"{split['optimizer'] * 1e3:>9.1f} {side['first_loss']:>7.3f} {side['padding']:>7.1%}"
        )
    lines.append("tokens/s counts the samples' tokens; padding is the share of the computed positions that are padding")
    if ranks > 1:
        per_device = report["ktrain"]["tokens_per_s_per_device"]
        lines.append(f"{ranks} ranks: {per_device:,.0f} tokens/s per device; MFU against all {ranks} devices' peaks")
    if report["ratio"] is not None:
        lines.append(f"ktrain / peer: {report['ratio']:.2f}x tokens/s")
    lines.extend(_describe_device_states(report))
    if report["device"] == "CPU":
        lines.append("peak memory: n/a on a CPU (the GPU's max_memory_allocated on a GPU)")
    return "\n".join(lines)


def _describe_device_states(report: dict[str, Any]) -> list[str]:
    """What the GPU did while each side was timed (rank 0's GPU), or why that was not read."""
    if report["device"] == "CPU":
        return []
    missing = report["device_state_missing"]
    if missing:
        return [f"device clock and power: not read ({missing})"]
    sides = [side for side in (report["ktrain"], report["peer"]) if side and side["device_state"]]
    return [
        f"device while timed, {side['name'].split(':')[0]}: {DeviceState(**side['device_state']).describe()}"
        for side in sides
    ]


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

    if args.steps < 1 or args.warmup < 0:
        print("ktrain: --steps must be at least 1 and --warmup at least 0", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        lengths = _lengths(args.lengths, args.peer_micro_batch)
    except ValueError as e:
        print(f"ktrain: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        print("ktrain: --nproc-per-node must be at least 1", file=sys.stderr)
        return EXIT_BAD_INPUT
    from ktrain.bench_ranks import RanksFailed

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
        )
    except RanksFailed as e:
        print(e, file=sys.stderr)
        return EXIT_FAILED
    except (DataError, FileNotFoundError) as e:
        print(f"ktrain: {e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    print(describe_report(report), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return EXIT_OK
