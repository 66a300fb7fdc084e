"""A micro-batch's loss on its way to the host, copied as soon as its forward is queued.

The step's non-finite check and its logged loss need the losses on the host before the update is queued.
A loss read after the backward waits for the whole backward, and the device then idles while the host
queues the update and the next step's forward (1.8 ms and more a step in an H200 trace, docs/performance.md).
On a GPU the copy is queued into pinned memory right after the forward, with an event; reading it waits
for the forward alone, which the device has long finished while the host queued the backward.
"""

from __future__ import annotations

import torch


class HostLoss:
    """The value of one loss tensor, copied to the host without waiting for what is queued after it."""

    def __init__(self, loss: torch.Tensor):
        value = loss.detach().double()
        self.event = None
        if value.device.type == "cuda":
            self.value = torch.empty((), dtype=torch.float64, pin_memory=True)
            self.value.copy_(value, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.value = value

    def read(self) -> float:
        """The loss as a float (on a GPU, once the device has reached the copy)."""
        if self.event is not None:
            self.event.synchronize()
        return float(self.value)
