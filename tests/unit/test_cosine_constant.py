"""``cosine_constant_lr_ratio``: the cosine reaches its floor at that share of the steps and holds it."""

import attrs
import torch

from ktrain.builtin.schedulers import cosine
from ktrain.config.keys import OptimizerKeys


def test_cosine_holds_floor_after_constant_ratio() -> None:
    config = attrs.evolve(OptimizerKeys(), cosine_min_lr_ratio=0.1, cosine_constant_lr_ratio=0.5)
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    schedule = cosine(optimizer, config, total_steps=10, warmup_steps=0)
    factors = [schedule.lr_lambdas[0](step) for step in range(10)]
    assert factors[0] == 1.0
    assert factors[1] > factors[2] > factors[4] > 0.1
    assert factors[5:] == [0.1] * 5
