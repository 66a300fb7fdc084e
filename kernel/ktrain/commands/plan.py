"""``ktrain plan CONFIG --gpus N``: will the config fit, and which layout that fits is fastest. No torch.

The config as written is checked for ``N x nodes`` ranks and its peak per rank predicted
(``ktrain.memory``); then layouts the installed plugins allow are tried: the sharding (the kernel's DDP,
FSDP2 with and without resharding, ZeRO-1/2/3 and ZeRO-3 with optimizer and weights offloaded), activation
checkpointing, tensor parallelism within a node, and smaller micro-batches with more accumulation
(the global batch kept). Those that fit are ordered by an estimated step time: compute at a measured
MFU, plus communication bytes at a stated bandwidth, not overlapped. ``--write OUT.yaml`` writes the
fastest as a config. ``ktrain check --gpu-memory`` and ``ktrain run`` (on GPUs, before the ranks start)
print the predicted peak and warn with that layout when the config is predicted not to fit.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from ktrain.config import fast_defaults
from ktrain.config.load import apply_override
from ktrain.config.plan import Plan, load_plugins_and_config, prepare
from ktrain.config.report import ConfigError
from ktrain.config.yaml_io import dump_yaml, load_yaml
from ktrain.memory.model import Prediction, predict
from ktrain.memory.shape import ModelShape, ShapeError, read_shape
from ktrain.plugins import PluginError

GIB = 1 << 30
MFU = 0.40
"""Model FLOPs utilization of the step: ``llama_1p5b`` on one H200 measured 40.1% (docs/performance.md)."""
PEAK_FLOPS = 989e12
"""Dense bf16 FLOP/s of an H100 or H200."""
NODE_BANDWIDTH = 300e9
"""Bytes a second a rank moves in a collective inside a node (NVLink), stated, not measured here."""
NETWORK_BANDWIDTH = 50e9
"""Bytes a second a rank moves in a collective between nodes (400 Gb/s a GPU), stated."""
HOST_BANDWIDTH = 25e9
"""Bytes a second between a GPU and host memory (PCIe 5), stated."""
SHARDING_KEYS = ("fsdp_version", "fsdp_config", "fsdp", "deepspeed")
AS_WRITTEN = "as written"
RUN_MARGIN = 0.10
"""``ktrain run`` warns when the predicted need exceeds the GPU's memory by more than this share: the predicted
peaks of configs/bench are within 10% of the measured ones (docs/plan.md)."""


def parse_bytes(text: str, flag: str) -> int:
    """``80GiB``, ``80G`` (binary), ``80GB`` (decimal) or a number of bytes; raises ``ConfigError`` naming ``flag``."""
    found = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)(B?)\s*", text, re.IGNORECASE)
    if not found:
        raise ConfigError.single(flag, f"{text!r} is not a size; write it like 80GiB or 141GB")
    number, prefix, binary, unit = found.groups()
    base = 1000 if unit and not binary else 1024
    return int(float(number) * base ** ("KMGT".index(prefix.upper()) + 1 if prefix else 0))


@attrs.frozen
class Layout:
    """A change from the config as written: a label and the edit of its YAML mapping."""

    label: str
    edit: Callable[[dict[str, Any]], None]
    sets: tuple[str, ...]


@attrs.frozen
class Candidate:
    """A layout with its micro-batch, predicted peak and estimated step time."""

    layout: Layout
    plan: Plan
    micro: int
    accumulation: int
    prediction: Prediction
    seconds: float
    unset: tuple[str, ...] = ()

    def label(self) -> str:
        """How ``ktrain plan`` names it (with the share of the blocks recomputed where it is not every block)."""
        fraction = self.plan.config.gradient_checkpointing_fraction
        share = f" {fraction}" if self.plan.config.gradient_checkpointing and fraction != 1.0 else ""
        label = self.layout.label.replace(", checkpointing", f", checkpointing{share}")
        return f"{label}, micro batch {self.micro} x {self.accumulation}"

    def sets(self) -> tuple[str, ...]:
        """The ``--set`` values that turn the config as written into this candidate."""
        batch = (f"micro_batch_size={self.micro}", f"gradient_accumulation_steps={self.accumulation}")
        return (*(f"{key}=null" for key in self.unset), *self.layout.sets, *batch)


def _strip(data: dict[str, Any]) -> None:
    """Remove the keys a layout sets itself: sharding, checkpointing, tensor parallelism."""
    for key in (*SHARDING_KEYS, "gradient_checkpointing", "tensor_parallel_size"):
        data.pop(key, None)


def _sharding_layouts(installed: set[str]) -> Iterator[tuple[str, list[str]]]:
    yield "DDP", []
    if "ktrain-plugin-fsdp" in installed:
        yield "FSDP2", ["fsdp_version=2"]
        yield "FSDP2 without resharding", ["fsdp_version=2", "fsdp_config.reshard_after_forward=false"]
    if "ktrain-plugin-deepspeed" in installed:
        for stage in (1, 2, 3):
            yield f"ZeRO-{stage}", [f"deepspeed=zero{stage}"]
        yield "ZeRO-3, optimizer and weights offloaded", ["deepspeed=zero3_bf16_cpuoffload_all"]


def layouts(installed: set[str], gpus_per_node: int, shape: ModelShape) -> list[Layout]:
    """The layouts to try: sharding x checkpointing x tensor-parallel size."""
    out = [Layout(AS_WRITTEN, lambda data: None, ())]
    tps = [tp for tp in (1, 2, 4, 8) if tp <= gpus_per_node and shape.kv_heads % tp == 0 and shape.heads % tp == 0]
    if "ktrain-plugin-parallel" not in installed:
        tps = [1]
    for name, sets in _sharding_layouts(installed):
        for checkpointing in (False, True):
            for tp in tps:
                if tp > 1 and not name.startswith(("FSDP2", "DDP")):
                    continue
                more = list(sets)
                if checkpointing:
                    fsdp = name.startswith("FSDP")
                    more.append("fsdp_config.activation_checkpointing=true" if fsdp else "gradient_checkpointing=true")
                if tp > 1:
                    more.append(f"tensor_parallel_size={tp}")
                label = name + (", checkpointing" if checkpointing else "") + (f", tp {tp}" if tp > 1 else "")

                def edit(data: dict[str, Any], more: list[str] = more) -> None:
                    _strip(data)
                    for assignment in more:
                        apply_override(data, assignment)

                out.append(Layout(label, edit, tuple(more)))
    return out


def step_seconds(config: Any, plan: Plan, prediction: Prediction, shape: ModelShape, nodes: int) -> float:
    """Estimated seconds of one optimizer step: FLOPs at ``MFU`` of ``PEAK_FLOPS``, plus the sharding's and
    tensor parallelism's communication at the stated bandwidths, not overlapped."""
    mesh = plan.mesh
    tokens = config.micro_batch_size * config.gradient_accumulation_steps * config.sequence_len * mesh.dp_size
    adapter = prediction.trained * 2 < shape.parameters  # no weight gradients for most of the model
    attention = 6 * shape.layers * shape.heads * shape.head_dim * config.sequence_len
    per_token = (4 if adapter else 6) * shape.parameters + attention
    checkpointing = prediction.checkpointing
    recompute = 2 * shape.parameters * checkpointing.fraction if checkpointing else 0
    compute = (per_token + recompute) * tokens / mesh.world_size / (PEAK_FLOPS * MFU)
    ranks = mesh.gradient_ranks
    bandwidth = NETWORK_BANDWIDTH if nodes > 1 else NODE_BANDWIDTH
    shard = (ranks - 1) / ranks if ranks > 1 else 0.0
    whole = shape.parameters * 2 / mesh.dims["tp"]  # one copy of the weights in bf16
    name = prediction.sharding
    if name.startswith("FSDP") or name.startswith("ZeRO-3"):
        moved = 3 * whole * config.gradient_accumulation_steps
    elif name.startswith("ZeRO"):
        moved = 2 * whole
    else:
        moved = 2 * prediction.states.gradients
    comm = moved * shard / bandwidth
    tp = mesh.dims["tp"]
    if tp > 1:
        rank_tokens = config.micro_batch_size * config.gradient_accumulation_steps * config.sequence_len
        comm += 8 * shape.layers * rank_tokens * shape.hidden * 2 * (tp - 1) / tp / NODE_BANDWIDTH
    offloaded = sum(prediction.states.host.values())
    return compute + comm + offloaded / HOST_BANDWIDTH


def _prepare(data: dict[str, Any], overrides: list[str], world: int, folder: Path, gpu_memory: int) -> Plan:
    """The checked plan of the config ``data`` (written into ``folder``) for ``world`` ranks on GPUs of
    ``gpu_memory`` bytes (``gradient_checkpointing_fraction: auto`` is resolved for them)."""
    out = folder / "candidate.yaml"
    out.write_text(dump_yaml(data), encoding="utf-8")
    return prepare(out, overrides, world_size=world, device="cuda", planned=True, gpu_memory=gpu_memory)


def _fits(prediction: Prediction, gpu_memory: int, host_memory: int | None, ranks_per_node: int) -> bool:
    host = sum(prediction.states.host.values()) * ranks_per_node
    return prediction.device_bytes <= gpu_memory and (host_memory is None or host <= host_memory)


def with_keys(config: Any, **values: Any) -> Any:
    """``config`` with the keys ``values`` changed, in whichever section owns each."""
    sections = {
        cls: attrs.evolve(obj, **{k: v for k, v in values.items() if k in attrs.fields_dict(cls)})
        for cls, obj in config.sections.items()
    }
    return attrs.evolve(config, sections=sections)


def _micro_batches(micro: int, rows: int) -> Iterator[tuple[int, int]]:
    """(micro, accumulation) making ``rows`` per data-parallel rank and step: ``micro`` (or fewer), then halved."""
    micro = min(micro, rows)
    while micro >= 1:
        if rows % micro == 0:
            yield micro, rows // micro
        micro //= 2


def search(args: argparse.Namespace, written: Plan, shape: ModelShape, gpu_memory: int) -> list[Candidate]:
    """Every layout of ``layouts`` that checks and fits, each at its largest micro-batch that fits, fastest first."""
    installed = {info.distribution for info in written.plugins.infos}
    data, _ = load_yaml(Path(args.config))
    world = args.gpus * args.nodes
    c = written.config
    rows = c.micro_batch_size * c.gradient_accumulation_steps * written.mesh.dp_size  # the global batch, kept
    found: list[Candidate] = []
    with tempfile.TemporaryDirectory(prefix="ktrain-plan-") as tmp:
        for layout in layouts(installed, args.gpus, shape):
            changed = {**data}
            layout.edit(changed)
            try:
                fresh = layout.label != AS_WRITTEN
                plan = _prepare(changed, _overrides(args, data), world, Path(tmp), gpu_memory) if fresh else written
            except (ConfigError, PluginError):  # a layout the config's other keys refuse is not a candidate
                continue
            if rows % plan.mesh.dp_size:
                continue
            for micro, accumulation in _micro_batches(c.micro_batch_size, rows // plan.mesh.dp_size):
                config = with_keys(plan.config, micro_batch_size=micro, gradient_accumulation_steps=accumulation)
                prediction = predict(config, plan.mesh, plan.plugins, shape)
                if _fits(prediction, gpu_memory, args.host_memory_bytes, args.gpus):
                    seconds = step_seconds(config, plan, prediction, shape, args.nodes)
                    unset = tuple(key for key in data if key not in changed)
                    found.append(Candidate(layout, plan, micro, accumulation, prediction, seconds, unset))
                    break
    return sorted(found, key=lambda c: c.seconds)


def _overrides(args: argparse.Namespace, data: dict[str, Any]) -> list[str]:
    """``--set`` values, and a placeholder dataset for a config without one (benchmark shapes)."""
    extra = [] if (data.get("datasets") or data.get("pretraining_dataset")) else ["datasets=[{path: .}]"]
    return [*args.overrides, *extra]


def _gib(n: int) -> str:
    return f"{n / GIB:.1f} GiB"


def describe(prediction: Prediction, gpu_memory: int) -> list[str]:
    """The lines of one prediction: each component, the peak, and whether it fits."""
    lines = [f"  {name:<22} {_gib(size):>10}" for name, size in prediction.components() if size]
    for name, size in prediction.states.host.items():
        lines.append(f"  {name + ' (host)':<22} {_gib(size):>10}")
    verdict = "fits in" if prediction.device_bytes <= gpu_memory else "does NOT fit in"
    lines.append(
        f"  peak per rank {_gib(prediction.peak)}; with the allocator's overhead and a CUDA context "
        f"{_gib(prediction.device_bytes)}: {verdict} {_gib(gpu_memory)}"
    )
    if prediction.not_modelled:
        lines.append(f"  not modelled: {', '.join(prediction.not_modelled)}")
    return lines


def write_config(path: Path, config_path: Path, overrides: list[str], candidate: Candidate) -> None:
    """Write the config at ``config_path`` with ``overrides`` (``--set``) and changed to ``candidate``, atomically,
    to ``path`` (its keys; comments are not kept)."""
    data, _ = load_yaml(config_path)
    for assignment in overrides:
        apply_override(data, assignment)
    candidate.layout.edit(data)
    data["micro_batch_size"] = candidate.micro
    data["gradient_accumulation_steps"] = candidate.accumulation
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(dump_yaml(data), encoding="utf-8")
    os.replace(tmp, path)


def configure(p: argparse.ArgumentParser) -> None:
    """The arguments of ``ktrain plan``."""
    p.add_argument("config", help="the run's YAML")
    p.add_argument("--gpus", type=int, metavar="N", help="GPUs per node (needed but with --measure)")
    p.add_argument("--nodes", type=int, default=1, metavar="M", help="nodes (default 1)")
    p.add_argument("--gpu-memory", default="80GiB", metavar="SIZE", help="memory of one GPU (default 80GiB)")
    p.add_argument("--host-memory", metavar="SIZE", help="host memory of a node, for offloaded states")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE", help="override a key")
    p.add_argument("--top", type=int, default=8, metavar="K", help="layouts to list (default 8)")
    p.add_argument("--write", type=Path, metavar="OUT.yaml", help="write the fastest layout that fits as a config")
    p.add_argument(
        "--measure",
        action="store_true",
        help="run two steps in one process on this machine and print predicted against measured, by component",
    )


def plan_cli(args: argparse.Namespace) -> int:
    """Run ``ktrain plan``; returns the exit code (2: bad input, 1: nothing fits)."""
    if args.measure:
        return measure_cli(args)
    if args.gpus is None:
        raise ConfigError.single("--gpus", "is needed: the GPUs per node to plan for (or --measure, on this machine)")
    gpu_memory = parse_bytes(args.gpu_memory, "--gpu-memory")
    args.host_memory_bytes = parse_bytes(args.host_memory, "--host-memory") if args.host_memory else None
    if args.gpus < 1 or args.nodes < 1:
        raise ConfigError.single("--gpus" if args.gpus < 1 else "--nodes", "must be at least 1")
    data, _ = load_yaml(Path(args.config)) if Path(args.config).is_file() else ({}, {})
    load_plugins_and_config(args.config, args.overrides)  # the config's own problems first, as ktrain check
    world = args.gpus * args.nodes
    written = prepare(args.config, _overrides(args, data), world_size=world, device="cuda", gpu_memory=gpu_memory)
    try:
        shape = read_shape(written.config)
    except ShapeError as e:
        raise ConfigError.single("base_model", str(e)) from None
    prediction = predict(written.config, written.mesh, written.plugins, shape)
    print(f"ktrain plan: {args.config} on {args.nodes} x {args.gpus} GPUs of {_gib(gpu_memory)}")
    print(f"model: {shape.model_type}, {shape.parameters / 1e9:.2f} B parameters; mesh {written.mesh.describe()}")
    c = written.config
    print(f"as written: {prediction.sharding}, {prediction.optimizer}, micro batch {c.micro_batch_size} x "
          f"{c.gradient_accumulation_steps}, sequence {c.sequence_len}")  # fmt: skip
    for choice in fast_defaults.applied(c):
        if choice.key == "gradient_checkpointing_fraction":
            print(choice.line())
    print("\n".join(describe(prediction, gpu_memory)))
    found = search(args, written, shape, gpu_memory)
    print(
        f"\nlayouts that fit, fastest first (estimated step: compute at {MFU:.0%} MFU of {PEAK_FLOPS / 1e12:.0f} "
        f"TFLOP/s, communication at {NODE_BANDWIDTH / 1e9:.0f} GB/s in a node and {NETWORK_BANDWIDTH / 1e9:.0f} GB/s "
        f"between nodes, not overlapped; an estimate):"
    )
    if not found:
        print("  none: try more GPUs, --gpu-memory, or an adapter (adapter: qlora)")
        return 1
    for i, cand in enumerate(found[: args.top], 1):
        print(f"  {i}. {cand.label():<58} peak {_gib(cand.prediction.device_bytes):>9}  step {cand.seconds:6.2f} s")
        print(f"     --set {' --set '.join(cand.sets())}")
    if args.write:
        write_config(args.write, Path(args.config), args.overrides, found[0])
        print(f"wrote {args.write}: {found[0].label()}")
    return 0


def check_memory(plan: Plan, config_path: str, overrides: list[str], gpu_memory_text: str) -> str:
    """``ktrain check --gpu-memory SIZE``: the predicted peak per rank of ``plan``, and, when it does not fit, a
    warning naming the fastest layout ``ktrain plan`` finds that fits (a warning: the model can be wrong)."""
    gpu_memory = parse_bytes(gpu_memory_text, "--gpu-memory")
    return "\n".join(memory_lines(plan, config_path, overrides, gpu_memory))


def memory_lines(
    plan: Plan, config_path: str, overrides: list[str], gpu_memory: int, nodes: int = 1, margin: float = 0.0
) -> list[str]:
    """The predicted peak per rank of ``plan`` against ``gpu_memory`` and, when it needs more than that by more
    than ``margin`` (a share of it), a warning with the fastest layout of ``ktrain plan`` that fits."""
    try:
        shape = read_shape(plan.config)
    except ShapeError as e:
        return [f"memory: not predicted ({e})"]
    prediction = predict(plan.config, plan.mesh, plan.plugins, shape)
    line = (
        f"memory: predicted peak per rank {_gib(prediction.peak)}, {_gib(prediction.device_bytes)} with the "
        f"allocator's overhead and a CUDA context, of {_gib(gpu_memory)} (`ktrain plan` shows the parts)"
    )
    if prediction.device_bytes <= gpu_memory * (1 + margin):
        return [line]
    args = argparse.Namespace(config=config_path, overrides=list(overrides), gpus=plan.mesh.world_size // nodes,
                              nodes=nodes, host_memory_bytes=None)  # fmt: skip
    found = search(args, plan, shape, gpu_memory)
    if not found:
        return [line, "ktrain: warning: predicted not to fit, and no layout of `ktrain plan` fits"]
    change = f"{found[0].label()} (--set {' --set '.join(found[0].sets())})"
    return [line, f"ktrain: warning: predicted not to fit; the fastest layout that fits: {change}"]


def say_memory(plan: Plan, args: argparse.Namespace) -> None:
    """``ktrain run``, before the ranks start: print the predicted peak per rank against the smallest GPU's memory
    (``torch.cuda.get_device_properties``; nothing off a GPU, where it is not known), with a warning when it is
    predicted not to fit by more than ``RUN_MARGIN``. Called by the launcher, which has imported torch."""
    import torch

    if not torch.cuda.is_available():
        return
    gpu_memory = min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))
    lines = memory_lines(plan, args.config, args.overrides, gpu_memory, args.nnodes, RUN_MARGIN)
    print(f"ktrain: {lines[0]}", flush=True)
    for warning in lines[1:]:
        print(warning, file=sys.stderr, flush=True)


def measure_cli(args: argparse.Namespace) -> int:
    """``ktrain plan CONFIG --measure``: two steps of the config in one process here, and for each component the
    predicted bytes (for the measured micro-batch's rows and length) against the measured, with their ratio."""
    from ktrain.memory.measure import measure
    from ktrain.run import outcome

    load_plugins_and_config(args.config, args.overrides)  # the config's own problems first, as ktrain check
    try:
        measured = measure(args.config, args.overrides)
    except outcome.bad_input_types() as e:  # bad data the run found: one line, as ktrain run says it
        print(f"ktrain: {outcome.one_line(e)}", file=sys.stderr)
        return 2
    plan = prepare(args.config, args.overrides, world_size=1, device=measured.device)  # the run's GPU defaults
    config = with_keys(plan.config, micro_batch_size=measured.rows, sequence_len=measured.length)
    try:
        prediction = predict(config, plan.mesh, plan.plugins)
    except ShapeError as e:
        raise ConfigError.single("base_model", str(e)) from None
    print(
        f"ktrain plan --measure: {args.config}, two steps in one process on {measured.device}, the first micro-batch "
        f"{measured.rows} x {measured.length} tokens; {prediction.sharding}, {prediction.optimizer}"
    )
    print(f"  {'component':<28} {'predicted':>12} {'measured':>12}  measured / predicted")
    s = prediction.states
    rows = [
        ("parameters", s.parameters, measured.parameters),
        ("gradients", s.gradients, measured.gradients),
        ("optimizer states", s.optimizer, measured.optimizer),
        ("activations (saved)", prediction.activations.saved, measured.activations),
        ("loss's log-softmax (saved)", prediction.logits // 3, measured.loss),
    ]
    if measured.casts:
        rows.append(("autocast's weight copies", 0, measured.casts))
    if measured.peak is not None:
        rows.append(("peak (max_memory_allocated)", prediction.peak, measured.peak))
    for name, predicted, real in rows:
        ratio = "equal" if real == predicted else f"{real / predicted:.3f}" if predicted else "-"
        print(f"  {name:<28} {_size(predicted):>12} {_size(real):>12}  {ratio}")
    return 0


def _size(n: int) -> str:
    """``n`` bytes in the largest binary unit under which it is at least 1."""
    for unit, scale in (("GiB", GIB), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"
