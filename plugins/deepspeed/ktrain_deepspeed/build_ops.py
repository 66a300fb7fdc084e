"""Compile DeepSpeed's CPU ops once, ahead of the runs: ``python -m ktrain_deepspeed.build_ops``.

Where there is no CUDA device DeepSpeed compiles, on first use, the C++ ops a CPU run needs (its
shared-memory communication at every start, CPU Adam when the optimizer is offloaded, FusedAdam when the
JSON names Adam) into ``~/.cache/torch_extensions``: 35 to 75 s each on an idle 2-core machine, longer on
a busy one. Runs after this one load them at once. The tests' command builds them first, so that no
run's time limit includes the compiler. With a CUDA device DeepSpeed's own ops apply; this does nothing.

A run that is about to compile one first says so in one line (``announce``): the build is long and silent.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from ktrain_deepspeed.accelerator import load_deepspeed

OPS = ("ShareMemCommBuilder", "CPUAdamBuilder", "FusedAdamBuilder")
WHAT = {
    "ShareMemCommBuilder": "shared-memory communication op",
    "CPUAdamBuilder": "CPU Adam",
    "FusedAdamBuilder": "FusedAdam",
}
"""What each op is, in the line a run prints before it compiles it."""


def built(name: str) -> bool:
    """Whether DeepSpeed's op ``name`` (its op builder's class name) is ready without compiling.

    It is when it is loaded already, installed with DeepSpeed, in torch's extension cache (the library the
    compiler left, under ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``), or when this
    accelerator has no such op to build.
    """
    load_deepspeed()
    import deepspeed.ops
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import installed_ops
    from torch.utils.cpp_extension import _get_build_directory

    builder = get_accelerator().create_op_builder(name)
    if builder is None or not deepspeed.ops.__compatible_ops__.get(builder.NAME, False):
        return True
    if builder.name in type(builder)._loaded_ops or installed_ops.get(builder.name, False):
        return True
    return (Path(_get_build_directory(builder.name, verbose=False)) / f"{builder.name}.so").is_file()


def announce(run: Any, names: tuple[str, ...]) -> None:
    """Before the ops ``names`` are loaded: one line on rank 0 for each that DeepSpeed is about to compile."""
    for name in names:
        if not built(name):
            run.say(f"building DeepSpeed's {WHAT[name]}, once, about a minute")


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
