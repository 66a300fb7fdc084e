"""What each rank runs: ``main([RUN_DIR, "--resume"?])``, forked by ``ktrain run`` (``ktrain.run.forked``).

Its output is routed (``ktrain.run.console``): ktrain's lines to the terminal, everything else (the
libraries' warnings and progress bars, an error's traceback) to ``RUN_DIR/logs/rank-N.log``.
Errors are recorded through torch elastic's error file, so the launcher shows the first failure; bad
input a rank finds (``ktrain.run.outcome``) is recorded as such, with exit code 2 and no traceback.
SIGINT, SIGTERM and SIGUSR1 stop every rank together (``ktrain.run.stop``; the last two after the step's
checkpoint) with exit code 130, 143 or 138. A rank the
agent restarts (``--max-restarts``) resumes from the latest checkpoint when there is one.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import time
from pathlib import Path


def _restarted_with_checkpoint(run_dir: Path) -> bool:
    """Whether the agent restarted this rank (``--max-restarts``) and a checkpoint is there to resume from."""
    from ktrain.run.checkpoints import checkpoint_root, committed_checkpoints

    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    return restarted and bool(committed_checkpoints(checkpoint_root(run_dir)))


def main(argv: list[str] | None = None) -> int:
    """Train one rank of the run whose config lies in RUN_DIR (under torch elastic's ``@record``), its output
    routed from the start."""
    from ktrain.run import console

    faulthandler.enable()  # a native crash of this rank logs its Python stack before the launcher reports it
    parser = argparse.ArgumentParser(prog="ktrain.run.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    console.route(args.run_dir, int(os.environ.get("RANK", "0")))

    from ktrain.run import outcome, stop
    from ktrain.run.trainer import rank_main

    try:
        with stop.handled():
            rank_main(args.run_dir, args.resume or _restarted_with_checkpoint(args.run_dir))
    except stop.Interrupted as e:
        return e.exit_code
    except Exception as e:
        if stop.requested():  # a peer stopped first (a closed connection): this follows from the stop
            return 128 + stop.requested()
        if isinstance(e, outcome.bad_input_types()):
            outcome.record_bad_input(e)
            return outcome.EXIT_BAD_INPUT
        if _peer_gone(e):  # the agent, seeing the peer's exit, stops this rank (SIGTERM: exit 143, quietly)
            time.sleep(PEER_GRACE_S)
        raise
    return 0


PEER_GRACE_S = 5.0
"""How long a rank whose peer has gone waits for the agent to stop it before it reports its own error."""


def _peer_gone(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank ended (its error is the run's cause)."""
    text = str(error)
    return "closed by peer" in text or "reset by peer" in text or type(error).__name__ == "DistNetworkError"
