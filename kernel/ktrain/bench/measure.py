"""One side after the other, timed on this rank: the plain Hugging Face peer (one process only), then ktrain.

The result is the report ``ktrain bench`` prints (``ktrain.bench.report``) and writes with ``--json``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import torch

from ktrain.bench import axolotl_peer
from ktrain.bench.axolotl_peer import AxolotlConfig, AxolotlTiming
from ktrain.bench.rows import LENGTH_SIGMA, Lengths, Pairs, padding
from ktrain.bench.timing import Timed, reset_memory, run_steps
from ktrain.bench.trainer import BenchTrainer
from ktrain.data.pipeline import TrainData
from ktrain.run import distributed, host_gc
from ktrain.run.context import Run
from ktrain.run.metrics import flops_per_token, non_embedding_params, peak_flops

FP8_TO_BF16_PEAK = 2.0
"""The dense FP8 peak over the dense bf16 peak of every GPU with float8 tensor cores (H100/H200: 1,979
against 989 TFLOP/s; L40S, B200 alike): a run with ``fp8: true`` is also reported against it."""


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
        "collections": dict(zip(("passes", "oldest", "seconds"), timed.collections, strict=True)),
    }


def _rows(synthetic: bool, lengths: Lengths | None, packed: bool, pairs: Pairs | None = None) -> str:
    """What the report says of the rows."""
    if pairs:
        return (
            f"random-token preference pairs: a prompt of {pairs[0]} tokens, chosen and rejected answers of "
            f"{pairs[1]} each, both sequences of a pair in one forward; tokens count both sequences, the prompt "
            "in each, whether or not the forward computes it once"
        )
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
    host_gc.release()  # what the first step froze (``Trainer._train_step``), back to the collector
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
    pairs: Pairs | None = None,
    axolotl: tuple[AxolotlTiming, AxolotlConfig] | None = None,
) -> dict[str, Any]:
    """Time the run's step on this rank, all ranks together (and first the peer's, in one process only).

    ``axolotl``: Axolotl's run of the same config, timed before (``ktrain.bench.axolotl_peer``), reported as the peer.

    tokens/s counts the tokens of every rank; MFU divides by the ranks' peaks; the peak memory is the
    largest of any rank, the losses are the token means over the global batch. Each rank times its own
    wall clock between the barriers; ``ktrain.bench.ranks`` reports rank 0's.
    """
    from ktrain.bench.peer import describe, run_peer

    cfg = run.config
    total = warmup + steps + (3 if profile_to else 0)
    timed_steps = range(warmup, warmup + steps)
    peak = peak_flops(run.device)
    report = _header(config, run, _rows(synthetic, lengths, cfg.sample_packing, pairs), warmup, steps, peak)
    pad_to = cfg.sequence_len if cfg.pad_to_sequence_len else None
    trainer = BenchTrainer(run)
    data = trainer.load_data(synthetic, total, lengths, pairs)
    if pairs:  # a pair is two sequences, its prompt in each
        report["tokens_per_step"] = data.train.tokens_per_step
        report["pairs_per_step"] = data.train.rows_per_step
    if peer == "trl":
        from ktrain.bench import trl_peer

        held = reset_memory(run.device)
        timed, flops, passes = trl_peer.run_trl_peer(
            cfg, data.train, run.pad_id, run.device, run.compute_dtype, warmup, steps
        )
        report["peer_setup"] = trl_peer.describe(cfg, run.compute_dtype)
        padded = padding(data.train, timed_steps, pad_to)
        report["peer"] = _side("peer trl: DPOTrainer", timed, flops, peak, held, padded)
        report["peer"]["passes"] = passes
    elif peer:
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
        (timed.peak_memory_gib,) = distributed.all_reduce_max([timed.peak_memory_gib])
    # each rank's loss is its share of the global token mean; ranks holding copies (tensor parallel) count once
    losses = distributed.all_reduce_sum([timed.first_loss, timed.last_loss])
    timed.first_loss, timed.last_loss = (loss / run.mesh.copies for loss in losses)
    flops = report["formula"]["flops_per_token"]
    all_peaks = peak * run.world_size if peak else None
    report["ktrain"] = _side("ktrain", timed, flops, all_peaks, held, padding(data.train, timed_steps, pad_to))
    # a pass over the data before the first step (precompute_ref_log_probs): timed by the objective, apart
    report["ktrain"]["passes"] = list(getattr(trainer.objective, "passes", None) or [])
    report["ktrain"]["tokens_per_s_per_device"] = report["ktrain"]["tokens_per_s"] / run.world_size
    if getattr(cfg, "fp8", False) and all_peaks:  # the fp8 plugin's key: MFU against the FP8 peak too, labelled
        report["fp8_peak_tflops"] = peak * FP8_TO_BF16_PEAK / 1e12
        report["ktrain"]["mfu_fp8_peak"] = report["ktrain"]["mfu"] / FP8_TO_BF16_PEAK
    report["device_state_missing"] = trainer.timeline.monitor.why_not
    if axolotl:
        timing, written = axolotl
        tokens_per_step = timed.tokens // timed.steps
        report["peer"] = axolotl_peer.side(timing, tokens_per_step, flops, peak, run.device.type == "cuda")
        report["peer_setup"] = (
            f"Axolotl's own log: median {axolotl_peer.TOKENS_PER_S} of the steps after the warm-up, "
            f"the largest {axolotl_peer.PEAK_GIB}; no split of its step"
        )
        report["peer_differences"] = list(written.differences)
    if report["peer"]:
        report["ratio"] = report["ktrain"]["tokens_per_s"] / report["peer"]["tokens_per_s"]
    return report
