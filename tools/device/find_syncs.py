"""Where the host waits for the GPU during ``ktrain bench``'s timed steps (device tool).

A call such as ``.item()``, ``bool(tensor)``, ``nonzero()`` or a copy to the GPU without ``non_blocking`` makes
the host wait until the device has run everything queued; within a step, the device then idles while the host
queues what follows. This runs ``ktrain bench`` in this process with PyTorch's synchronization check on during
the timed steps only (``torch.cuda.set_sync_debug_mode``), and prints each place that synchronized, with how
often and the ktrain frames that led there:

    python tools/device/find_syncs.py configs/bench/llama_1p5b_dpo.yaml --pairs 512:512 --warmup 2 --steps 3

The arguments are ``ktrain bench``'s (one process; a peer, if asked for, is not checked: its loop is not ours).
It reports what PyTorch's check reports (``.item()``, copies to the host, ``nonzero`` and the like; compiling
in the timed steps, as with ``--warmup 0``, shows as such waits in the forward); an explicit wait on an event
or a stream is not checked, such as the step's one read of its loss (``ktrain.run.host_loss``), which waits
for the last forward while the backward is already queued.
"""

from __future__ import annotations

import collections
import sys
import traceback
import warnings
from typing import Any

import torch

from ktrain.bench import timing
from ktrain.cli import main

OURS = ("/ktrain/", "/ktrain_", "/plugins/")
FRAMES = 6


def ours(frame: traceback.FrameSummary) -> bool:
    return any(part in frame.filename for part in OURS) and "find_syncs" not in frame.filename


def run(argv: list[str]) -> int:
    found: collections.Counter[tuple[str, ...]] = collections.Counter()

    def record(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
        if "synchronizing CUDA operation" not in str(message):
            print(warnings.formatwarning(message, category, filename, lineno, line), end="", file=sys.stderr)
            return
        stack = [f for f in traceback.extract_stack()[:-1] if ours(f)][-FRAMES:]
        found[tuple(f"{f.filename}:{f.lineno} {f.name}: {f.line}" for f in stack) or (f"{filename}:{lineno}",)] += 1

    start, stop = timing.Timeline.start, timing.Timeline.stop

    def checked_start(self: timing.Timeline) -> None:
        start(self)
        if self.cuda:
            torch.cuda.set_sync_debug_mode("warn")

    def checked_stop(self: timing.Timeline) -> Any:
        if self.cuda:
            torch.cuda.set_sync_debug_mode("default")
        return stop(self)

    timing.Timeline.start, timing.Timeline.stop = checked_start, checked_stop
    warnings.simplefilter("always")
    warnings.showwarning = record
    code = main(["bench", *argv])
    print(f"\nfind_syncs: {sum(found.values())} synchronizations in the timed steps, at {len(found)} places")
    for stack, count in found.most_common():
        print(f"\n{count} x")
        print("\n".join(f"    {frame}" for frame in stack))
    return code


if __name__ == "__main__":
    if not torch.cuda.is_available():
        sys.exit("find_syncs: needs a CUDA device (it checks the GPU's synchronizations)")
    sys.exit(run(sys.argv[1:]))
