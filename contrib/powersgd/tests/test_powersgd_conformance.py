"""ktrain-plugin-powersgd passes the sharding conformance suite, declared lossy, and compresses for real."""

import torch

from ktrain.testing import ShardingConformance, read_metrics
from ktrain.testing.conformance import ShardingRuns

pytest_plugins = ["ktrain.testing"]


class TestPowerSGDConformance(ShardingConformance):
    """The suite over the kernel's DDP with PowerSGD as its comm hook, and what is particular to PowerSGD."""

    plugin_yaml = "powersgd: true"
    entry_point = "powersgd"
    owns_sharding = False
    lossy = "PowerSGD sends a rank-1 approximation of each gradient matrix from step 3"
    steps = 6  # the middle checkpoint, step 3, falls after compression started: resume restores its state

    def test_powersgd_ran_and_its_state_was_saved(self, sharding_runs: ShardingRuns) -> None:
        """Each rank's checkpoint holds PowerSGD's step count and its error feedback, once compression began."""
        run = sharding_runs.plugin_two_ranks()
        for step in (self.steps // 2, self.steps):
            for rank in (0, 1):
                path = run / "checkpoints" / f"step-{step:08d}" / f"rank-{rank}.pt"
                state = torch.load(path, weights_only=True)["plugins"]["powersgd"]
                assert state["iter"] == step and state["gradient_ranks"] == 2, (path, state["iter"])
                errors = state["parameters"]["error"]
                assert errors and all(torch.isfinite(e).all() for e in errors.values()), path

    def test_compression_changes_the_losses_only_after_it_starts(self, sharding_runs: ShardingRuns) -> None:
        """Steps 1-3 log one process's losses (step 3's update is the first compressed one); step 4 on differ."""
        want = read_metrics(sharding_runs.one_process())
        got = read_metrics(sharding_runs.plugin_two_ranks())
        for step in sorted(want):
            close = abs(got[step] - want[step]) <= self.loss_rtol * abs(want[step])
            assert close == (step <= 3), (step, got[step], want[step])
