"""How long ``ktrain run`` takes around a tiny run on this machine: the launcher, the ranks' start and the end.

    python tests/benchmarks/launch_overhead.py [--ranks 1,2] [--rounds 3] [--steps 8]

Each round runs the testing kit's tiny Llama (``ktrain.testing``) for ``--steps`` steps on 400 chat rows, once per
number of ranks, from a fresh run directory (so the launcher tokenizes each time), as ``ktrain run`` in a
subprocess whose output is read to its end, as a script or a test reads it. Printed per run: the seconds until
the first step's line, until the launcher exited, and until the output ended (any process still holding it,
such as a fork server, keeps it open). The training itself is a fraction of a second of each figure.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from ktrain.testing import dataset, model_dir, write_config


def timed_run(config: Path, ranks: int) -> tuple[float, float, float]:
    """Seconds from the start of ``ktrain run`` to its first step's line, to its exit, to its output's end."""
    command = [sys.executable, "-m", "ktrain.cli", "run", str(config), "--overwrite", "--nproc-per-node", str(ranks)]
    start = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    first_step = float("nan")
    exited: list[float] = []
    waiter = threading.Thread(target=lambda: (process.wait(), exited.append(time.perf_counter() - start)))
    waiter.start()
    assert process.stdout is not None
    lines = []
    for line in process.stdout:
        lines.append(line)
        if first_step != first_step and line.startswith("step 1/"):
            first_step = time.perf_counter() - start
    ended = time.perf_counter() - start
    waiter.join()
    if process.returncode:
        raise SystemExit(f"ktrain run failed ({process.returncode}):\n{''.join(lines)[-3000:]}")
    return first_step, exited[0], ended


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", default="1,2", help="comma-separated numbers of ranks")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    print(f"{os.cpu_count()} CPUs; seconds to the first step / the launcher's exit / the output's end")
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        model_dir(root)
        dataset(root, 400)
        for round_ in range(1, args.rounds + 1):
            for ranks in (int(n) for n in args.ranks.split(",")):
                shutil.rmtree(root / "out", ignore_errors=True)
                config = write_config(root, max_steps=args.steps)
                step, exited, ended = timed_run(config, ranks)
                print(f"round {round_}, {ranks} rank(s): {step:6.2f} {exited:6.2f} {ended:6.2f}", flush=True)


if __name__ == "__main__":
    main()
