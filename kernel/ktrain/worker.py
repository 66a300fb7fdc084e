"""What each rank runs: ``python -m ktrain.worker RUN_DIR [--resume]`` (started by ``ktrain run``).

Errors are recorded through torch elastic's error file, so the launcher shows the first failure.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main(argv: list[str] | None = None) -> int:
    """Train one rank of the run whose config lies in RUN_DIR."""
    from ktrain.run.trainer import rank_main

    parser = argparse.ArgumentParser(prog="ktrain.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--resume", action="store_true")
    args = parser.parse_args(argv)
    rank_main(args.run_dir, args.resume)
    return 0


if __name__ == "__main__":
    sys.exit(main())
