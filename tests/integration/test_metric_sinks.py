"""The kernel guards every metric sink: one that raises is reported once and dropped, and training goes on."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

from ktrain.testing import KtrainProject, read_metrics

pytest_plugins = ["ktrain.testing"]

SINKS = textwrap.dedent(
    """
    import json
    from pathlib import Path

    from ktrain import hookimpl


    class Sink:
        def __init__(self, path, fail_at):
            self.path, self.fail_at = path, fail_at

        def write(self, step, metrics):
            if step == self.fail_at:
                raise OSError("disk full\\nsecond line")
            with open(self.path, "a") as f:
                f.write(json.dumps(step) + "\\n")

        def close(self):
            with open(self.path, "a") as f:
                f.write('"closed"\\n')


    def refuse(run):
        raise ConnectionError("no server")


    @hookimpl
    def ktrain_register_metric_sinks(register):
        register("flaky", lambda run: Sink(Path(run.output_dir) / "flaky.jsonl", fail_at=2))
        register("steady", lambda run: Sink(Path(run.output_dir) / "steady.jsonl", fail_at=None))
        register("unreachable", refuse)
    """
)


def lines(path: Path) -> list[object]:
    """The JSON values of the lines of ``path``."""
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def test_a_failing_sink_warns_once_is_dropped_and_the_run_finishes(ktrain_project: KtrainProject) -> None:
    ktrain_project.install_plugin("sinks", SINKS, distribution="ktrain-plugin-sinks", version="1.2")
    done = ktrain_project.ktrain("run", str(ktrain_project.config(max_steps=4)))
    assert done.returncode == 0, done.stderr[-3000:]
    warnings = [line for line in done.stderr.splitlines() if "warning: metric sink" in line]
    assert warnings == [  # the factories run as training starts, before any step is written
        "ktrain: warning: metric sink 'unreachable' (ktrain-plugin-sinks 1.2) failed in open (ConnectionError: no "
        "server) and is dropped; training goes on and metrics.jsonl has every metric",
        "ktrain: warning: metric sink 'flaky' (ktrain-plugin-sinks 1.2) failed in write (OSError: disk full second "
        "line) and is dropped; training goes on and metrics.jsonl has every metric",
    ], done.stderr[-3000:]
    run_dir = ktrain_project.root / "runs" / "run"
    assert sorted(read_metrics(run_dir)) == [1, 2, 3, 4]
    assert lines(run_dir / "flaky.jsonl") == [1]  # never called again, not even closed
    assert lines(run_dir / "steady.jsonl") == [1, 2, 3, 4, "closed"]
