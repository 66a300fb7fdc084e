"""Compile DeepSpeed's CPU ops once, ahead of the runs: ``python -m ktrain_deepspeed.build_ops``.

Where there is no CUDA device DeepSpeed compiles, on first use, the C++ ops a CPU run needs (its
shared-memory communication at every start, CPU Adam when the optimizer is offloaded, FusedAdam when the
JSON names Adam) into ``~/.cache/torch_extensions``: 35 to 75 s each on an idle 2-core machine, longer on
a busy one. Runs after this one load them at once. The tests' command builds them first, so that no
run's time limit includes the compiler. With a CUDA device DeepSpeed's own ops apply; this does nothing.
"""

from __future__ import annotations

import sys
import time

from ktrain_deepspeed.accelerator import load_deepspeed

OPS = ("ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder")


def main() -> int:
    """Build (or load from the cache) each op of ``OPS`` on the CPU accelerator; print how long each took."""
    load_deepspeed()
    from deepspeed.accelerator import get_accelerator

    accelerator = get_accelerator()
    if accelerator.device_name() != "cpu":
        print(f"DeepSpeed runs on {accelerator.device_name()} here: no CPU ops to build")
        return 0
    for name in OPS:
        start = time.perf_counter()
        accelerator.create_op_builder(name).load(verbose=False)
        print(f"DeepSpeed op {name}: ready in {time.perf_counter() - start:.1f} s", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
