"""``HostLoss``: the step's loss read on the host, waiting for its forward and not for what follows it."""

from __future__ import annotations

import pytest
import torch

from ktrain.run.host_loss import HostLoss


def test_the_value_is_the_loss_s() -> None:
    loss = torch.tensor(2.5, dtype=torch.bfloat16, requires_grad=True) * 1.5
    assert HostLoss(loss).read() == float(loss)


@pytest.mark.gpu
def test_the_read_waits_for_the_forward_not_for_the_work_queued_after_it() -> None:
    """Without the early copy, reading the loss would wait for the second or so of matrix multiplies queued
    after it (the backward, in a step); with it, they are still running when the value is in hand."""
    loss = torch.randn(4096, device="cuda").square().mean()
    want = loss.item()
    copy = HostLoss(loss)
    a = torch.randn(8192, 8192, device="cuda")
    for _ in range(40):  # about 44 TFLOP in fp32
        torch.mm(a, a)
    after = torch.cuda.Event()
    after.record()
    assert copy.read() == pytest.approx(want)
    assert not after.query()  # the multiplies queued after the copy have not finished
    after.synchronize()
