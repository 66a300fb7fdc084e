"""What rank 0 tells the user: a line (or a progress bar on a terminal) per logged step, metrics.jsonl and the sinks.

Every registered metric sink is guarded: one whose factory, ``write``, ``close`` or a call its plugin makes
through ``MetricsLog.send`` raises is reported once (``ktrain: warning: ...``, naming the sink and its
plugin) and dropped; training goes on, and metrics.jsonl, written before any sink, has every record.

MFU counts ``6 · N + 12 · layers · hidden · seq`` FLOPs per token (N: parameters outside the
embeddings, ZeRO-3 partitions counted whole; the second term is attention) against the device's dense
bf16 peak (``KTRAIN_PEAK_TFLOPS`` overrides; unknown devices and CPUs report no MFU).
"""

from __future__ import annotations

import json
import math
import os
import resource
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from ktrain.plugins import PluginInfo
from ktrain.registry import collect
from ktrain.run.files import atomic_write_text

PEAK_TFLOPS = {"H100": 989.0, "H200": 989.0, "H800": 989.0, "A100": 312.0, "A800": 312.0, "L40S": 362.0, "B200": 2250.0}


def peak_flops(device: torch.device) -> float | None:
    """Dense bf16 FLOP/s of ``device``, or None when unknown."""
    if "KTRAIN_PEAK_TFLOPS" in os.environ:
        return float(os.environ["KTRAIN_PEAK_TFLOPS"]) * 1e12
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((tf * 1e12 for key, tf in PEAK_TFLOPS.items() if key in name), None)


def _numel(p: torch.Tensor) -> int:
    """Elements of a parameter, whole: ZeRO-3 leaves each rank an empty tensor and the size in ``ds_numel``;
    a 4-bit quantized weight packs two elements a byte and keeps its shape in ``quant_state``."""
    if hasattr(p, "ds_numel"):
        return p.ds_numel
    shape = getattr(getattr(p, "quant_state", None), "shape", None)
    return math.prod(shape) if shape is not None else p.numel()


def non_embedding_params(model: Any, frozen: bool = False) -> int:
    """Parameters outside the input embeddings (``nn.Embedding``); an untied output layer counts.

    ``frozen``: count only those that get no gradient (the base of an adapter run).
    """
    embeddings = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    return sum(_numel(p) for p in model.parameters() if id(p) not in embeddings and not (frozen and p.requires_grad))


def flops_per_token(model: Any, seq_len: int) -> float:
    """Training FLOPs per token of a decoder model (forward and backward).

    A trained weight costs 6 FLOPs a token (forward, input gradient, weight gradient), a frozen one 4
    (no weight gradient); attention adds 12 x layers x hidden x sequence. Recomputation is not counted.
    """
    cfg = getattr(model, "config", None)
    layers = getattr(cfg, "num_hidden_layers", 0) or 0
    hidden = getattr(cfg, "hidden_size", 0) or 0
    weights = 6.0 * non_embedding_params(model) - 2.0 * non_embedding_params(model, frozen=True)
    return weights + 12.0 * layers * hidden * seq_len


def peak_memory_gib(device: torch.device) -> float:
    """Peak device memory (GPU) or peak resident memory of this process (CPU), in GiB."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20


class Sink:
    """A metric sink of a run: its registered name, its plugin and, once opened, the object it returned."""

    def __init__(self, name: str, plugin: PluginInfo):
        self.name = name
        self.plugin = plugin
        self.obj: Any = None
        self.dropped = False

    def call(self, what: str, action: Callable[[], Any]) -> Any:
        """``action()``; when it raises, one warning and the sink is dropped (later calls do nothing, return None)."""
        if self.dropped:
            return None
        try:
            return action()
        except Exception as e:
            self.dropped = True
            error = " ".join(f"{type(e).__name__}: {e}".split())
            print(
                f"ktrain: warning: metric sink '{self.name}' ({self.plugin.distribution} {self.plugin.version}) "
                f"failed in {what} ({error}) and is dropped; training goes on and metrics.jsonl has every metric",
                file=sys.stderr,
                flush=True,
            )
            return None


def open_sinks(run: Any) -> list[Sink]:
    """Rank 0, as training starts: each registered sink's ``factory(run)``; those that answer None are left out."""
    opened = []
    registry = collect(run.plan.plugins, "ktrain_register_metric_sinks", "metric sink")
    for name, (factory, plugin) in registry.items.items():
        sink = Sink(name, plugin)
        sink.obj = sink.call("open", lambda factory=factory: factory(run))
        if sink.obj is not None:
            opened.append(sink)
    return opened


class MetricsLog:
    """Rank 0's log: console, ``metrics.jsonl`` and the open sinks (from ``open_sinks``)."""

    def __init__(self, path: Path, start_step: int, total_steps: int, sinks: list[Sink], enabled: bool):
        self.enabled = enabled
        self.total_steps = total_steps
        self.sinks = sinks
        self.tty = sys.stdout.isatty()
        self.file = None
        if enabled:
            _drop_records_after(path, start_step)
            self.file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the run
        self.started = time.perf_counter()
        self.first_step: int | None = None
        self.drawn = 0.0  # when the bar was last drawn
        self.shown = ""  # the metrics of the last logged step, as the bar shows them

    def write(self, step: int, metrics: dict[str, float]) -> None:
        """Log ``metrics`` at ``step``: metrics.jsonl first, then every sink, then the console."""
        if not self.enabled:
            return
        record = {"step": step, **metrics}
        self.file.write(json.dumps(record) + "\n")
        self.file.flush()
        for sink in self.sinks:
            sink.call("write", lambda sink=sink: sink.obj.write(step, metrics))
        self._print(step, metrics)

    def send(self, name: str, what: str, action: Callable[[Any], Any]) -> None:
        """``action(sink)`` on the open sink ``name`` (e.g. a tracker's model upload, ``what`` names it), under the
        guard of ``write``; nothing when the sink is not open here (another rank, not asked for, or dropped)."""
        for sink in self.sinks:
            if sink.name == name:
                sink.call(what, lambda sink=sink: action(sink.obj))

    def tick(self, step: int) -> None:
        """After every step: on a terminal, redraw the bar when a second has passed since it was last drawn.

        It shows the step, the ETA and the last logged metrics: facts already on the host, so the step
        waits for nothing.
        """
        if not self.enabled:
            return
        now = time.perf_counter()
        if self.first_step is None:  # the ETA counts from the first step, also where lines are printed instead
            self.first_step, self.started = step, now
        if self.tty and now - self.drawn >= 1.0:
            self._bar(step, self.shown)

    def _eta(self, step: int) -> str:
        if self.first_step is None:
            self.first_step, self.started = step, time.perf_counter()
        done = step - self.first_step
        if done <= 0:
            return "?"
        left = (time.perf_counter() - self.started) / done * (self.total_steps - step)
        return time.strftime("%H:%M:%S", time.gmtime(left))

    def _bar(self, step: int, shown: str) -> None:
        width = 20
        filled = int(width * step / max(self.total_steps, 1))
        line = f"step {step}/{self.total_steps} {shown} eta {self._eta(step)}".replace("  ", " ")
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {line}\033[K", end="", flush=True)
        self.drawn = time.perf_counter()
        if step == self.total_steps:
            print()

    def _print(self, step: int, metrics: dict[str, float]) -> None:
        shown = " ".join(f"{k} {_fmt(v)}" for k, v in metrics.items())
        if self.tty and "loss" in metrics:
            self.shown = shown
            self._bar(step, shown)
        elif "loss" in metrics:
            print(f"step {step}/{self.total_steps} {shown} eta {self._eta(step)}", flush=True)
        else:
            print(("\n" if self.tty else "") + f"step {step}/{self.total_steps} {shown}", flush=True)

    def close(self) -> None:
        if self.file:
            self.file.close()
        for sink in self.sinks:
            sink.call("close", sink.obj.close)


def _drop_records_after(path: Path, step: int) -> None:
    """On resume, forget what a killed run logged after its last checkpoint: those steps run again."""
    if not path.exists():
        return
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = [line for line in lines if line.strip() and json.loads(line).get("step", 0) <= step]
    if len(kept) != len(lines):
        atomic_write_text(path, "".join(line + "\n" for line in kept))


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1e5 else f"{value:.3e}"
    return str(value)
