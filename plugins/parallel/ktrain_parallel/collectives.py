"""Collectives with gradients, over the sequence dimension (dim 2 of ``[batch, heads, seq, head_dim]``).

``gather_sequence``: every rank's shard, concatenated in rank order; its backward sums the gradients
of all ranks and keeps this rank's part (a reduce-scatter). ``seq_to_heads`` / ``heads_to_seq``: the
Ulysses all-to-all, from a sequence shard of all heads to the whole sequence of a head shard, and
back; each one's backward is the other. They run on NCCL and on gloo alike.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist


def _gather(x: torch.Tensor, group: Any) -> torch.Tensor:
    size = dist.get_world_size(group)
    flat = x.permute(2, 0, 1, 3).contiguous()  # sequence first, so that ranks' shards concatenate
    out = flat.new_empty((size * flat.shape[0], *flat.shape[1:]))
    dist.all_gather_into_tensor(out, flat, group=group)
    return out.permute(1, 2, 0, 3)


def _reduce_scatter(x: torch.Tensor, group: Any) -> torch.Tensor:
    size = dist.get_world_size(group)
    flat = x.permute(2, 0, 1, 3).contiguous()
    out = flat.new_empty((flat.shape[0] // size, *flat.shape[1:]))
    dist.reduce_scatter_tensor(out, flat, group=group)
    return out.permute(1, 2, 0, 3)


class _GatherSequence(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any) -> torch.Tensor:
        ctx.group = group
        return _gather(x, group)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _reduce_scatter(grad, ctx.group), None


def gather_sequence(x: torch.Tensor, group: Any) -> torch.Tensor:
    """``[b, h, s, d]`` shards of every rank of ``group`` -> ``[b, h, ranks * s, d]``, in rank order."""
    return _GatherSequence.apply(x, group)


def _all_to_all(x: torch.Tensor, group: Any, to_heads: bool) -> torch.Tensor:
    size = dist.get_world_size(group)
    b, h, s, d = x.shape
    if to_heads:  # [b, h, s, d] -> [b, h / size, size * s, d]
        send = x.reshape(b, size, h // size, s, d).transpose(0, 1).contiguous()
    else:  # [b, h, S, d] -> [b, h * size, S / size, d]
        send = x.reshape(b, h, size, s // size, d).permute(2, 0, 1, 3, 4).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    if to_heads:  # received[src] holds rank src's sequence shard of my heads
        return received.permute(1, 2, 0, 3, 4).reshape(b, h // size, size * s, d)
    return received.transpose(0, 1).reshape(b, h * size, s // size, d)  # received[src]: head group src


class _AllToAll(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, group: Any, to_heads: bool) -> torch.Tensor:
        ctx.group, ctx.to_heads = group, to_heads
        return _all_to_all(x, group, to_heads)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _all_to_all(grad.contiguous(), ctx.group, not ctx.to_heads), None, None


def seq_to_heads(x: torch.Tensor, group: Any) -> torch.Tensor:
    """Ulysses: ``[b, h, s, d]`` (all heads, my sequence shard) -> ``[b, h / n, n * s, d]`` (my heads)."""
    return _AllToAll.apply(x, group, True)


def heads_to_seq(x: torch.Tensor, group: Any) -> torch.Tensor:
    """The inverse of ``seq_to_heads``: ``[b, h / n, n * s, d]`` -> ``[b, h, s, d]``."""
    return _AllToAll.apply(x, group, False)
