"""What each rank runs: ``python -m ktrain.worker RUN_DIR [--resume]`` (started by ``ktrain run``).

Errors are recorded through torch elastic's error file, so the launcher shows the first failure. A rank
the agent restarts (``--max-restarts``) resumes from the latest checkpoint when there is one.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record


def _restarted_with_checkpoint(run_dir: Path) -> bool:
    """Whether the agent restarted this rank (``--max-restarts``) and a checkpoint is there to resume from."""
    from ktrain.run.checkpoints import checkpoint_root, committed_checkpoints

    restarted = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0"
    return restarted and bool(committed_checkpoints(checkpoint_root(run_dir)))


@record
def main(argv: list[str] | None = None) -> int:
    """Train one rank of the run whose config lies in RUN_DIR."""
    from ktrain.run.trainer import rank_main

    faulthandler.enable()  # a native crash of this rank prints its Python stack before the launcher reports it
    parser = argparse.ArgumentParser(prog="ktrain.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    rank_main(args.run_dir, args.resume or _restarted_with_checkpoint(args.run_dir))
    return 0


if __name__ == "__main__":
    from ktrain.hard_exit import end_process

    end_process(main())  # a rank that raised leaves through the traceback, its error recorded for the launcher
