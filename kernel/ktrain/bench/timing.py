"""Timing training steps for ``ktrain bench``: warm-up, timed steps, and each step split into parts.

The parts are ``data`` (fetching and collating the rows and copying them to the device; the next step's first
micro-batch is queued after a step's backward, before its update), ``forward_backward`` and ``optimizer``
(clipping, the update, the schedule, zeroing the gradients). Each part is the time from
the previous mark to its own. On a GPU the marks are CUDA events recorded in the stream as the host passes
each point and read once after the timed steps, so the step is never stalled to be timed; a part is then
the GPU's time between marks, which includes the GPU waiting for the host (that is how a slow data path
shows). On a CPU the marks are the host's clock. The wall time of the timed steps (the device synchronized
before and after, and on several ranks all ranks met) gives tokens/s.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import attrs
import torch
import torch.distributed as dist

from ktrain.bench.device import DeviceMonitor, DeviceState
from ktrain.run.host_gc import Collections

PARTS = ("data", "forward_backward", "optimizer")


class Timeline:
    """Marks along the timed steps; ``mark`` does nothing outside ``start``/``stop``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.marks: list[tuple[str, Any]] = []
        self.active = False
        self.started = 0.0
        self.monitor = DeviceMonitor(device)
        self.collections = Collections()

    def _now(self) -> Any:
        if not self.cuda:
            return time.perf_counter()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def _sync(self) -> None:
        """Wait for this device, then for every rank (one process: no wait)."""
        if self.cuda:
            torch.cuda.synchronize(self.device)
        if dist.is_initialized() and dist.get_world_size() > 1:
            dist.barrier()

    def start(self) -> None:
        self._sync()
        self.marks = [("start", self._now())]
        self.started = time.perf_counter()
        self.active = True
        self.monitor.start()
        self.collections.start()

    def mark(self, part: str) -> None:
        """The end of ``part`` (one of ``PARTS``) of the current step."""
        if self.active:
            self.marks.append((part, self._now()))

    def stop(self) -> tuple[float, dict[str, float], DeviceState | None]:
        """Wall seconds since ``start``, the seconds spent in each part, and the GPU's clock, power and
        temperature meanwhile (None without NVML)."""
        self._sync()
        wall = time.perf_counter() - self.started
        self.active = False
        state = self.monitor.stop()
        self.collections.stop()
        parts = dict.fromkeys(PARTS, 0.0)
        for (_, before), (part, after) in zip(self.marks, self.marks[1:], strict=False):
            parts[part] += before.elapsed_time(after) / 1e3 if self.cuda else after - before
        return wall, parts, state


@attrs.define
class Timed:
    """What the steps of one side gave: the timed steps' tokens, seconds and parts, and two losses."""

    steps: int
    tokens: int
    seconds: float
    parts: dict[str, float]
    first_loss: float
    """The loss of the very first step, before any update: the same init and rows give the same loss."""
    last_loss: float
    peak_memory_gib: float | None
    device_state: DeviceState | None = None
    collections: tuple[int, int, float] = (0, 0, 0.0)
    """The host's garbage collections while timed: how many, how many of the oldest generation, their seconds."""


def run_steps(step: Callable[[int], tuple[Any, int]], warmup: int, steps: int, timeline: Timeline) -> Timed:
    """``warmup`` untimed steps, then ``steps`` timed ones; ``step(i)`` returns (loss, input tokens).

    The peak memory is the peak since the caller's last ``reset_memory`` (before the model was built).
    The loss may be a tensor: only the first and the last are read, so that the loop does not wait for
    the device (the first step's wait falls in the timed steps only without warm-up).
    """
    first = None
    for i in range(warmup):
        loss, _ = step(i)
        first = float(loss) if i == 0 else first
    timeline.start()
    tokens = 0
    for i in range(warmup, warmup + steps):
        loss, n = step(i)
        first = float(loss) if i == 0 else first
        tokens += n
    seconds, parts, state = timeline.stop()
    memory = peak_memory_gib(timeline.device)
    return Timed(steps, tokens, seconds, parts, first, float(loss), memory, state, timeline.collections.totals())


def peak_memory_gib(device: torch.device) -> float | None:
    """Peak allocated GPU memory since the last reset, in GiB; None on a CPU (no peak that can be reset)."""
    if device.type != "cuda":
        return None
    return torch.cuda.max_memory_allocated(device) / 2**30


def reset_memory(device: torch.device) -> float | None:
    """Release cached GPU memory and restart the peak; return what is still allocated (GiB), None on a CPU."""
    import gc

    gc.collect()
    if device.type != "cuda":
        return None
    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats(device)
    return torch.cuda.memory_allocated(device) / 2**30
