"""ktrain-plugin-zero-redundancy passes the sharding conformance suite at 1 and 2 CPU ranks, and shards for real."""

from __future__ import annotations

import json
import shutil

from ktrain.testing import ShardingConformance, read_metrics
from ktrain.testing.conformance import ShardingRuns

pytest_plugins = ["ktrain.testing"]


class TestZeroRedundancyConformance(ShardingConformance):
    """The whole suite, plus what is particular to ZeRO: the state is split, and checkpoints hold it whole."""

    plugin_yaml = "zero_redundancy: true"
    entry_point = "zero_redundancy"

    def test_optimizer_state_is_sharded(self, sharding_runs: ShardingRuns) -> None:
        """On 2 ranks, rank 0 holds about half of the optimizer state that 1 rank holds."""
        one = read_metrics(sharding_runs.plugin_one_rank(), "optimizer_state_mib")
        two = read_metrics(sharding_runs.plugin_two_ranks(), "optimizer_state_mib")
        assert one.keys() == two.keys() == set(range(1, self.steps + 1))
        assert 0.45 < two[self.steps] / one[self.steps] < 0.55, (one, two)

    def test_a_two_rank_checkpoint_resumes_on_one_rank(self, sharding_runs: ShardingRuns) -> None:
        """The optimizer state is saved whole, so 1 rank continues the 2-rank run: the same micro-batches of 2 rows,
        4 of them a step instead of 2 on each rank (a resume keeps the global batch and the micro-batch)."""
        whole = sharding_runs.plugin_two_ranks()
        out = whole.parent / f"{whole.name}-on-one-rank"
        shutil.copytree(whole, out)
        for later in sorted((out / "checkpoints").glob("step-*"))[1:]:
            shutil.rmtree(later)
        shutil.rmtree(out / "final")
        project = sharding_runs.cache.project(self.env)
        keys = {
            "max_steps": self.steps,
            "save_steps": self.steps // 2,
            "micro_batch_size": 2,
            "gradient_accumulation_steps": 4,
        }
        config = project.config(self.plugin_yaml, name=out.name, output_dir=str(out), **keys)
        project.train(config, "--resume", nproc=1)
        resumed, reference = read_metrics(out), read_metrics(whole)
        manifest = json.loads((out / "checkpoints" / f"step-{self.steps:08d}" / "manifest.json").read_text())
        assert manifest["world_size"] == 1 and manifest["format"] == "zero-redundancy"
        for step in range(self.steps // 2 + 1, self.steps + 1):
            assert abs(resumed[step] - reference[step]) <= self.loss_rtol * reference[step], (step, resumed, reference)
