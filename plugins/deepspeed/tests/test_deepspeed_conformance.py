"""ktrain-plugin-deepspeed passes the kernel's sharding conformance suite under ZeRO-2 at 1 and 2 CPU ranks.

The suite compares with one process at the same global batch (losses, gradient norms, final weights),
checks accumulation, an exact resume, the export, the roles and a light entry module. ZeRO-2 runs here;
ZeRO-1 and ZeRO-3 are compared in test_deepspeed_training.py (the suite's model is random-initialised,
which ZeRO-3 does in its own way, so ZeRO-3 there starts from saved weights).
"""

from __future__ import annotations

import shutil

from ktrain.testing import ShardingConformance
from ktrain.testing.conformance import ShardingRuns

pytest_plugins = ["ktrain.testing"]


class TestDeepSpeedConformance(ShardingConformance):
    """The whole suite with the zero2 preset, plus: a ZeRO-2 checkpoint refuses another number of ranks."""

    plugin_yaml = "deepspeed: zero2"
    entry_point = "deepspeed"

    def test_a_checkpoint_resumes_only_on_the_ranks_that_wrote_it(self, sharding_runs: ShardingRuns) -> None:
        """Each rank's file holds its ZeRO partition: resuming the 2-rank run on 1 rank stops, saying what to do."""
        whole = sharding_runs.plugin_two_ranks()
        out = whole.parent / f"{whole.name}-on-one-rank"
        shutil.copytree(whole, out)
        shutil.rmtree(out / "final")
        project = sharding_runs.cache.project(self.env)
        keys = {"max_steps": self.steps, "micro_batch_size": 2, "gradient_accumulation_steps": 4}
        config = project.config(self.plugin_yaml, name=out.name, output_dir=str(out), **keys)
        done = project.ktrain("run", str(config), "--resume", "--nproc-per-node", "1")
        assert done.returncode == 2, done.stderr[-3000:]
        assert "holds ZeRO-2 partitions of 2 ranks; this run has 1, and only a ZeRO-3 checkpoint" in done.stderr
        assert "Resume with --nproc-per-node 2" in done.stderr
        assert "Traceback" not in done.stderr
