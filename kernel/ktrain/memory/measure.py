"""What one rank really holds in two steps of a config: ``ktrain plan --measure``'s side of the comparison.

The run is one process on the local device (a GPU, else the CPU), in a temporary ``output_dir``; an
observer plugin counts storages, each once (a flat buffer under many views counts its whole size):

- parameters: the model's, at the start of training, with what a quantized weight keeps beside its packed
  data (bitsandbytes' ``quant_state``: block scales, their own scales and code tables; 8-bit row scales);
- gradients: those of the weights the optimizer steps and of the model's parameters, just before its
  first update; optimizer states: its state tensors just after it, and the weights it steps that are
  not the model's (fp32 masters);
- activations: the tensors autograd saves for backward during the first micro-batch's forward
  (``torch.autograd.graph.saved_tensors_hooks``), parameters and their views left out; those saved
  after the output layer are the loss's (its fp32 log-softmax), and autocast's copies of the weights in
  the compute dtype, counted apart;
- on CUDA, ``torch.cuda.max_memory_allocated`` at the end of the second step.

Imports torch: only ``ktrain plan --measure`` loads it.
"""

from __future__ import annotations

import contextlib
import io
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import attrs
import torch

from ktrain import hookimpl

STEPS = 2


@attrs.frozen
class Measured:
    """Bytes one rank held, by component; ``casts`` are autocast's copies of the weights that backward keeps;
    ``rows`` x ``length`` the measured micro-batch's tokens; ``peak`` the allocator's peak on CUDA."""

    device: str
    parameters: int
    gradients: int
    optimizer: int
    activations: int
    loss: int
    casts: int
    rows: int
    length: int
    peak: int | None = None


def local_tensor(t: torch.Tensor) -> torch.Tensor:
    """The tensor this rank stores: ZeRO-3's partition, or a DTensor's local shard."""
    held = getattr(t, "ds_tensor", None)
    t = held if held is not None else t
    return t.to_local() if hasattr(t, "to_local") else t


def storages(tensors: Iterable[torch.Tensor | None], into: dict[int, int]) -> dict[int, int]:
    """Add the storage (address -> bytes) of each non-empty tensor of ``tensors`` to ``into``; returns it."""
    for t in tensors:
        if t is not None and local_tensor(t).numel() > 0:
            s = local_tensor(t).untyped_storage()
            into[s.data_ptr()] = s.nbytes()
    return into


def _quantization_tensors(state: Any) -> list[torch.Tensor]:
    """The tensors of a bitsandbytes ``QuantState`` and of the state nested in it (double quantization)."""
    if state is None:
        return []
    own = [v for v in vars(state).values() if torch.is_tensor(v)]
    return own + _quantization_tensors(getattr(state, "state2", None))


def model_storages(model: torch.nn.Module, into: dict[int, int]) -> dict[int, int]:
    """``storages`` of the model's parameters and of what a quantized weight keeps beside its data: its
    ``quant_state`` (on the parameter, or on its layer once a sharding has replaced the parameter) and an
    8-bit weight's row scales ``SCB``; returns ``into``."""
    parameters = list(model.parameters())
    storages(parameters, into)
    for owner in [*parameters, *model.modules()]:
        storages([*_quantization_tensors(getattr(owner, "quant_state", None)), getattr(owner, "SCB", None)], into)
    return into


def torch_optimizer(opt: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside a wrapper (DeepSpeed's ZeRO optimizer)."""
    while not isinstance(opt, torch.optim.Optimizer):
        opt = opt.optimizer
    return opt


def _cast_of_parameter(t: torch.Tensor) -> bool:
    """Whether ``t`` (or the tensor it views) is a parameter cast to another dtype (autocast's weight copies)."""
    fn = (t._base if t._base is not None else t).grad_fn
    if fn is None or type(fn).__name__ != "ToCopyBackward0":
        return False
    return any(type(f).__name__ == "AccumulateGrad" for f, _ in fn.next_functions if f is not None)


class Probe:
    """An observer plugin: counts the first step's model states and the first training forward's saved tensors."""

    def __init__(self) -> None:
        self.grads: dict[int, int] = {}
        self.states: dict[int, int] = {}
        self.saved: dict[str, dict[int, int]] = {"activations": {}, "loss": {}, "casts": {}}
        self.phase: str | None = None
        self.shape = (0, 0)
        self.parameters = 0
        self.peak: int | None = None

    def _pack(self, t: torch.Tensor) -> torch.Tensor:
        own = isinstance(t, torch.nn.Parameter) or isinstance(t._base, torch.nn.Parameter)
        if self.phase is not None and not own and t.untyped_storage().data_ptr() not in self.model_storages:
            storages([t], self.saved["casts" if _cast_of_parameter(t) else self.phase])
        return t

    def _watch_forward(self, model: torch.nn.Module) -> None:
        """Count what the first forward with gradients saves, by phase: the blocks, then after the output layer."""
        hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, lambda t: t)

        def before(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
            if self.shape == (0, 0) and torch.is_grad_enabled():
                ids = kwargs.get("input_ids", args[0] if args else None)
                self.shape = tuple(ids.shape)
                self.phase = "activations"
                hooks.__enter__()

        def after(module: Any, args: Any, output: Any) -> None:
            if self.phase is not None:
                self.phase = None
                hooks.__exit__(None, None, None)

        def to_loss(module: Any, args: Any, output: Any) -> None:
            if self.phase is not None:
                self.phase = "loss"

        model.register_forward_pre_hook(before, with_kwargs=True)
        model.register_forward_hook(after)
        model.get_output_embeddings().register_forward_hook(to_loss)

    @hookimpl
    def ktrain_on_train_start(self, run: Any, engine: Any) -> None:
        optimizer = torch_optimizer(engine.optimizer)
        model = engine.model
        self.model_storages = model_storages(model, {})
        self.parameters = sum(self.model_storages.values())
        self._watch_forward(model)
        first = {"before": True, "after": True}

        def before(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if first["before"]:
                held = [p for g in opt.param_groups for p in g["params"]]
                storages([p.grad for p in held] + [p.grad for p in model.parameters()], self.grads)
                mine = [p for p in held if local_tensor(p).untyped_storage().data_ptr() not in self.model_storages]
                storages(mine, self.states)

        def after(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            if first["after"]:
                states = [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v) and v.dim() > 0]
                storages(states, self.states)

        optimizer.register_step_pre_hook(before)
        optimizer.register_step_post_hook(after)
        self.first = first

    @hookimpl
    def ktrain_on_step_end(self, run: Any, step: int, metrics: dict[str, float]) -> None:
        self.first.update(before=False, after=False)  # DeepSpeed steps one parameter group a call: the step's calls
        if step == STEPS and run.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(run.device)

    def result(self, device: str) -> Measured:
        """The counts of the run, once it has ended."""
        rows, length = self.shape
        return Measured(
            device=device,
            parameters=self.parameters,
            gradients=sum(self.grads.values()),
            optimizer=sum(self.states.values()),
            activations=sum(self.saved["activations"].values()),
            loss=sum(self.saved["loss"].values()),
            casts=sum(self.saved["casts"].values()),
            rows=rows,
            length=length,
            peak=self.peak,
        )


def measure(config_path: str | Path, overrides: list[str]) -> Measured:
    """Run ``STEPS`` steps of the config at ``config_path`` (with ``overrides``) in this process and count what
    its rank held. Raises ``ConfigError`` when the config cannot run as one process here."""
    from ktrain.config.plan import prepare
    from ktrain.run import outcome
    from ktrain.run.directory import prepare_run_dir
    from ktrain.run.trainer import rank_main

    probe = Probe()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()  # an earlier measure in this process left its peak
    with tempfile.TemporaryDirectory(prefix="ktrain-measure-") as tmp:
        more = [f"max_steps={STEPS}", "save_strategy='no'", f"output_dir={tmp}/run"]
        plan = prepare(config_path, [*overrides, *more], world_size=1, device=device)
        run_dir, lock = prepare_run_dir(plan, resume=False, overwrite=True)
        output = io.StringIO()  # the run's lines and the libraries': only the comparison is printed, or a failure
        try:
            with contextlib.redirect_stdout(output), contextlib.redirect_stderr(output):
                rank_main(run_dir, False, extra_plugins=(("ktrain_measure", probe),))
        except outcome.bad_input_types():
            raise  # said in one line by the command
        except BaseException:
            sys.stderr.write(output.getvalue())  # what the run wrote, to explain its failure
            raise
        finally:
            lock.close()
    return probe.result(device)
