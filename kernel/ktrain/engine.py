"""The object ``ktrain_shard`` returns: how a step's backward, accumulation, clipping and update happen.

The kernel's loop only calls the methods below. An engine that leaves the step to the kernel (FSDP,
DDP, one process) keeps the defaults; one that owns it (DeepSpeed) overrides them and says so through
the ``owns_*`` flags, so the kernel never scales a loss or clips a second time.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch.nn.parallel import DistributedDataParallel


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Optimizer parameter groups: decay on matrices (2-D and up) only, not on biases and norm weights."""
    params = [p for p in model.parameters() if p.requires_grad]
    decay = [p for p in params if p.ndim >= 2]
    rest = [p for p in params if p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0.0}]


class Engine:
    """A sharded (or plain) model with its optimizer and scheduler, as the loop drives it.

    ``module`` is what the loop calls forward on; ``model`` is the unwrapped model (for export and
    generation). The loop hands ``backward`` a loss already normalised for the whole global batch
    (summed over micro-batches and ranks, it is the token-mean loss of the step).
    """

    owns_backward = False
    owns_accumulation = False
    owns_clipping = False
    owns_scheduler = False
    scaler: torch.amp.GradScaler | None = None
    """Set by the kernel, never by a plugin: right after ``ktrain_shard`` returns, a ``GradScaler`` when the run
    computes in fp16 and the engine does not own backward; None otherwise. ``backward`` scales with it, ``step``
    unscales before clipping and steps through it; its state is saved in each rank's checkpoint file."""
    _listed: list[torch.Tensor] | None = None

    def __init__(self, module: Any, model: Any, optimizer: Any, lr_scheduler: Any, max_grad_norm: float | None):
        self.module = module
        self.model = model
        self.optimizer = optimizer
        self.lr_scheduler = lr_scheduler
        self.max_grad_norm = max_grad_norm or None  # 0: no clipping

    @contextlib.contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        """Context of one micro-batch; ``last`` is True for the final one of the optimizer step."""
        yield

    def backward(self, loss: torch.Tensor) -> None:
        (self.scaler.scale(loss) if self.scaler else loss).backward()

    def clip_grad_norm(self) -> torch.Tensor | float:
        """Clip to ``max_grad_norm`` (when set) and return the global gradient norm before clipping.

        The norm may be a 0-d tensor on the device: ``step`` reads it only after the update is queued, so
        the host does not wait for the device between clipping and the update. Sharded gradients
        (DTensors) are grouped by mesh and placement, each group's norm made whole, then combined:
        tensor-parallel and data-sharded parameters live on different meshes. An optimizer with a
        ``scale_gradients(scale)`` method takes the clipping coefficient instead, to apply in its update.
        """
        params = [p for p in self._parameters() if p.grad is not None]
        groups: dict[Any, list[torch.Tensor]] = {}
        for p in params:
            layout = (id(p.grad.device_mesh), p.grad.placements) if hasattr(p.grad, "device_mesh") else None
            groups.setdefault(layout, []).append(p.grad)
        norms = []
        for grads in groups.values():
            norm = torch.nn.utils.get_total_norm(grads)
            norms.append(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        if not norms:
            return 0.0
        total = torch.linalg.vector_norm(torch.stack([n.to(norms[0].device) for n in norms]))
        if self.max_grad_norm is not None:
            scale_gradients = getattr(self.optimizer, "scale_gradients", None)
            if scale_gradients is None:
                torch.nn.utils.clip_grads_with_norm_(params, self.max_grad_norm, total)
            else:  # the optimizer scales each gradient as it reads it (adamw_fp32_master): no pass of its own
                scale_gradients(torch.clamp(self.max_grad_norm / (total + 1e-6), max=1.0))
        return total

    def _parameters(self) -> list[torch.Tensor]:
        """The model's parameters, listed at the first step, not walked from the module tree at every step (over
        a thousand modules with LoRA adapters on every linear layer: host time while the device waits)."""
        if self._listed is None:
            self._listed = list(self.model.parameters())
        return self._listed

    def step(self) -> torch.Tensor | float:
        """Finish the optimizer step: clip, update, advance the schedule, zero the gradients.

        Returns the gradient norm before clipping, possibly a 0-d tensor still on the device: the loop
        reads it on logged steps only, so that the host never waits for the update to finish.
        """
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        norm = self.clip_grad_norm()
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.lr_scheduler.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def full_state_dict(self) -> dict[str, torch.Tensor]:
        """The whole model's state on CPU, on rank 0 at least (export calls it on every rank)."""
        return {k: v.detach().cpu() for k, v in self.model.state_dict().items()}

    def lr(self) -> float:
        return float(self.optimizer.param_groups[0]["lr"])

    def train(self, mode: bool = True) -> None:
        self.module.train(mode)


class DataParallelEngine(Engine):
    """An engine whose ``module`` may be DDP: the gradient all-reduce is skipped on all but the last micro-batch.

    The kernel owns the step. Plugins that wrap the model in ``DistributedDataParallel`` (the kernel's
    default sharding, contrib's ``zero_redundancy``) build this engine or a subclass of it; a plugin that
    only changes how DDP communicates (a comm hook, bucket sizes) answers ``ktrain_collect_ddp_options``
    and keeps the kernel's.
    """

    @contextlib.contextmanager
    def accumulate(self, last: bool) -> Iterator[None]:
        if last or not isinstance(self.module, DistributedDataParallel):
            yield
        else:
            with self.module.no_sync():
                yield
