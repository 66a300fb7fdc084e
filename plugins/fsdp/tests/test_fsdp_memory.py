"""FSDP's memory: per-rank parameter and optimizer-state memory falls as 1/N (the benchmark behind the README's
figures, run small), and the memory model's last moment of backward, FSDP2's reduce of the root unit, is the bytes
a real FSDP2 rank allocates then."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import transformers
from torch.distributed.device_mesh import init_device_mesh

from ktrain.memory.parts import OptimizerModel, Weight
from ktrain.memory.shape import read_shape
from ktrain.testing import model_dir
from ktrain_fsdp.fsdp2 import apply_fsdp2
from ktrain_fsdp.memory import FsdpMemory
from ktrain_fsdp.options import FsdpOptions

BENCHMARK = Path(__file__).resolve().parents[1] / "benchmarks" / "shard_memory.py"
LOSS_BYTES = 8
"""The loss and backward's seed gradient (fp32 scalars), alive while the root unit reduces."""


@pytest.mark.slow
def test_sharded_parameters_and_optimizer_state_fall_as_one_over_n() -> None:
    done = subprocess.run(
        [sys.executable, str(BENCHMARK), "--ranks", "2", "--tiny"],
        capture_output=True,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = re.findall(r"^\| (\d+) \| ([\d.]+) \| ([\d.]+) \| ([\d.]+) ", done.stdout, re.MULTILINE)
    (ranks, params, optim, share) = rows[0]
    assert len(rows) == 1 and ranks == "2", done.stdout
    # share of the unsharded fp32 parameters + AdamW's two moments: 1/2, plus FSDP's padding of dim 0 to
    # a multiple of 2 (none for these even sizes); the optimizer state is twice the parameters, sharded alike
    assert 0.5 <= float(share) <= 0.5 * 1.02, done.stdout
    assert float(optim) == pytest.approx(2 * float(params), rel=0.01)


@pytest.fixture(scope="module")
def one_rank() -> Iterator[None]:
    """A process group of this process alone (gloo)."""
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _allocated_during_root_reduce(model: torch.nn.Module, ids: torch.Tensor, folder: Path) -> tuple[int, int]:
    """(the most CPU bytes allocated during the root unit's reduce, those held after the step) of a forward and
    backward of ``model``, counted from its start: the profiler reports each allocation with a running total."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        model(input_ids=ids, labels=ids).loss.backward()
    prof.export_chrome_trace(str(folder / "trace.json"))
    events = json.loads((folder / "trace.json").read_text(encoding="utf-8"))["traceEvents"]
    root = max((e for e in events if e["name"] == "FSDP::post_backward_reduce"), key=lambda e: e["ts"])
    memory = sorted(
        (e["ts"], e["args"]["Total Allocated"], e["args"]["Bytes"]) for e in events if e["name"] == "[memory]"
    )
    start = memory[0][1] - memory[0][2]  # the total counts what earlier profiles left
    during = [total - start for ts, total, _ in memory if root["ts"] <= ts <= root["ts"] + root["dur"]]
    return max(during), memory[-1][1] - start


@pytest.mark.parametrize("weights", [torch.bfloat16, torch.float32])
def test_the_root_units_last_reduce_is_what_fsdp2_allocates(one_rank: None, tmp_path: Path, weights: Any) -> None:
    """One CPU rank, bf16 compute: at the end of backward FSDP2 reduces the root unit (the embedding, the final
    norm, the output layer; here most of the model) in fp32 beside every gradient: the predicted gradients and
    last reduce are the bytes allocated, exactly, with the loss's two scalars."""
    folder = model_dir(tmp_path, vocab_size=3000)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.from_pretrained(folder))
    model = model.to(weights)
    run = types.SimpleNamespace(rank=0, device=torch.device("cpu"), compute_dtype=torch.bfloat16)
    options = FsdpOptions(2)
    apply_fsdp2(model, run, options, init_device_mesh("cpu", (1,)), (type(model.model.layers[0]),))
    ids = torch.randint(0, 3000, (2, 16))
    model(input_ids=ids, labels=ids).loss.backward()  # the first step's lazy initialization, then none held
    for p in model.parameters():
        p.grad = None
    peak, held = _allocated_during_root_reduce(model, ids, tmp_path)

    shape = read_shape(types.SimpleNamespace(base_model_config=None, base_model=str(folder)))
    element = torch.finfo(weights).bits // 8
    tensors = [Weight(t.name, t.shape, t.kind, t.block, element) for t in shape.tensors()]
    states = FsdpMemory(options, 1, 2).states(tensors, OptimizerModel("adamw_torch"), 0)
    assert (peak, held) == (states.gradients + states.last_reduce + LOSS_BYTES, states.gradients)
