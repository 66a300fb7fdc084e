"""Timing a call on the current CUDA stream, for the benchmarks beside this file (run as scripts)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

import torch


def time_ms(fn: Callable[[], object], rounds: int = 20, warmup: int = 5) -> float:
    """Median milliseconds of ``fn()`` on the current CUDA stream: ``rounds`` timed calls (CUDA events) after
    ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
