"""PowerSGD's state kept per parameter, so that it survives DDP laying its buckets out again.

PowerSGD keeps two tensors per DDP bucket: the error feedback (one value per gradient element, at the
gradient's place in the bucket) and the warm-start Q matrices (an ``m x rank`` block per compressed
gradient, grouped by shape). DDP lays its buckets out in parameter order, and after the first step
again in the order the gradients became ready; a resumed run starts from the first layout. So a
checkpoint holds the state per parameter name, and ``AlignedPowerSGD.hook`` splits it back into each
bucket's tensors at the bucket's first call under a new layout: a resumed run goes on exactly.
"""

from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

Slices = list[tuple[str, int, int]]
"""(parameter name, start, length) in one flat tensor of a bucket."""


class BucketLayout:
    """Where each parameter's gradient lies in a bucket, and where its Q block lies in PowerSGD's memory."""

    def __init__(self, bucket: dist.GradBucket, names: dict[int, str], state: powersgd.PowerSGDState):
        buffer = bucket.buffer()
        self.length = buffer.numel()
        self.names = tuple(names[id(p)] for p in bucket.parameters())
        self.error: Slices = []
        groups: dict[tuple[int, int], Slices] = {}
        self.p_size = 0
        for name, grad in zip(self.names, bucket.gradients(), strict=True):
            self.error.append((name, (grad.data_ptr() - buffer.data_ptr()) // grad.element_size(), grad.numel()))
            n, m = grad.shape[0], grad.numel() // grad.shape[0]
            rank = min(n, m, state.matrix_approximation_rank)
            if (n + m) * rank * state.min_compression_rate < n * m:  # PowerSGD's rule: worth compressing
                groups.setdefault((n, m), []).append((name, 0, m * rank))
                self.p_size += n * rank
        self.q: Slices = []
        start = 0
        for group in groups.values():  # PowerSGD lays Q out shape by shape, in order of first appearance
            for name, _, length in group:
                self.q.append((name, start, length))
                start += length


def split(flat: torch.Tensor, slices: Slices) -> dict[str, torch.Tensor]:
    return {name: flat[start : start + length].clone() for name, start, length in slices}


class AlignedPowerSGD:
    """``powerSGD_hook`` behind a check of each bucket's layout; ``per_parameter`` and ``restore`` for checkpoints."""

    def __init__(self, state: powersgd.PowerSGDState, model: torch.nn.Module):
        self.state = state
        self.names = {id(p): name for name, p in model.named_parameters()}
        self.layouts: dict[int, BucketLayout] = {}
        self.pending: dict[str, dict[str, torch.Tensor]] = {"error": {}, "q": {}}

    def per_parameter(self) -> dict[str, dict[str, torch.Tensor]]:
        """The error feedback and the Q blocks of every parameter, by name (what is not yet placed included)."""
        out = {"error": dict(self.pending["error"]), "q": dict(self.pending["q"])}
        for index, layout in self.layouts.items():
            if index in self.state.error_dict:
                out["error"].update(split(self.state.error_dict[index], layout.error))
            if index in self.state.q_memory_dict:
                out["q"].update(split(self.state.q_memory_dict[index], layout.q))
        return out

    def restore(self, per_parameter: dict[str, dict[str, Any]]) -> None:
        """Take saved per-parameter state; each bucket gets its share at its next call."""
        self.pending = {"error": dict(per_parameter["error"]), "q": dict(per_parameter["q"])}
        self.layouts.clear()
        for memory in (self.state.error_dict, self.state.p_memory_dict, self.state.q_memory_dict):
            memory.clear()

    def hook(self, state: powersgd.PowerSGDState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """PowerSGD on ``bucket``, after moving the state into this bucket's layout when it changed."""
        index = bucket.index()
        names = tuple(self.names[id(p)] for p in bucket.parameters())
        known = self.layouts.get(index)
        if known is None or known.names != names:
            if known is not None:  # DDP laid its buckets out again: every bucket's state goes by parameter
                self.restore(self.per_parameter())
            layout = self.layouts[index] = BucketLayout(bucket, self.names, state)
            self._place(index, layout)
        return powersgd.powerSGD_hook(state, bucket)

    def _place(self, index: int, layout: BucketLayout) -> None:
        """Assemble this bucket's error feedback and warm-start memory from the pending per-parameter state."""
        error, q = self.pending["error"], self.pending["q"]
        if layout.error and all(name in error for name, _, _ in layout.error):
            flat = torch.zeros(
                layout.length, dtype=error[layout.error[0][0]].dtype, device=error[layout.error[0][0]].device
            )
            for name, start, length in layout.error:
                flat[start : start + length] = error.pop(name)
            self.state.error_dict[index] = flat
        if layout.q and all(name in q for name, _, _ in layout.q):
            self.state.q_memory_dict[index] = torch.cat([q.pop(name) for name, _, _ in layout.q])
            like = self.state.q_memory_dict[index]
            self.state.p_memory_dict[index] = torch.empty(layout.p_size, dtype=like.dtype, device=like.device)
