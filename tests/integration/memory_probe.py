"""A plugin for tests/integration/test_memory_model.py: the bytes each rank holds at its first step.

Storages are counted once each (a flat buffer under many views counts its whole size; a quantized weight with
its quantization state), with the helpers of
``ktrain plan --measure`` (``ktrain.memory.measure``), on every rank. Gradients are those
of the weights the optimizer steps (under ZeRO its fp32 partitions) and of the model's parameters, read
just before the optimizer's update; optimizer states are its state tensors (read just after it) and the
weights it steps that are not the model's own (ZeRO's fp32 master partitions). DeepSpeed steps one
parameter group at a time, so every call adds to the count.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch

from ktrain import hookimpl
from ktrain.memory.measure import local_tensor, model_storages, storages, torch_optimizer


class Measure:
    """Counts the storages of the run's first step and writes ``rank-R.json`` into ``$KTRAIN_MEASURE_DIR``."""

    def __init__(self) -> None:
        self.grads, self.states, self.done = {}, {}, False

    @hookimpl
    def ktrain_on_train_start(self, run: Any, engine: Any) -> None:
        optimizer = torch_optimizer(engine.optimizer)
        self.model = engine.model
        model = storages(engine.model.parameters(), {})

        def before(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            held = [p for g in opt.param_groups for p in g["params"]]
            storages([p.grad for p in held] + [p.grad for p in engine.model.parameters()], self.grads)
            storages([p for p in held if local_tensor(p).untyped_storage().data_ptr() not in model], self.states)

        def after(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
            storages(states, self.states)

        optimizer.register_step_pre_hook(before)
        optimizer.register_step_post_hook(after)

    @hookimpl
    def ktrain_on_step_end(self, run: Any, step: int, metrics: dict[str, float]) -> None:
        if self.done:
            return
        self.done = True
        held = {
            "parameters": sum(model_storages(self.model, {}).values()),
            "gradients": sum(self.grads.values()),
            "optimizer": sum(self.states.values()),
        }
        (Path(os.environ["KTRAIN_MEASURE_DIR"]) / f"rank-{run.rank}.json").write_text(json.dumps(held))


@hookimpl
def ktrain_activate(config: Any, activate: Any) -> None:
    """Take part in every run of the test's project."""
    activate(Measure())
