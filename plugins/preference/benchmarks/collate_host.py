"""The host's time to collate a micro-batch of preference pairs into one row a pair (the prompt once), on CPU.

    python plugins/preference/benchmarks/collate_host.py [--pairs 512:512] [--micro 4] [--repeat 50]

The pairs are ``ktrain bench --pairs``'s random-token pairs. The mask is built on PyTorch's ``meta`` device: its
operations are dispatched as on a GPU, and nothing is computed, so the figure is the host's part of a GPU step's
collation (on a GPU the mask is built on the device). Prints the median of ``--repeat`` calls for each attention.
"""

from __future__ import annotations

import argparse
import statistics
import time
import types

from ktrain.bench.rows import PairRows
from ktrain_preference.layout import shared_rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", default="512:512", help="PROMPT:ANSWER token lengths")
    parser.add_argument("--micro", type=int, default=4, help="pairs a micro-batch")
    parser.add_argument("--repeat", type=int, default=50)
    args = parser.parse_args()
    prompt, answer = (int(n) for n in args.pairs.split(":"))
    config = types.SimpleNamespace(micro_batch_size=args.micro, gradient_accumulation_steps=1, seed=0)
    samples = [sample for (sample,) in PairRows(32000, config, prompt, answer).step(0)[0][0]]
    for attention in ("sdpa", "flex_attention"):
        shared_rows(samples, 0, attention, False, "meta")  # first call: imports and caches
        times = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            shared_rows(samples, 0, attention, False, "meta")
            times.append(time.perf_counter() - start)
        median = statistics.median(times) * 1e3
        print(f"{attention}: {median:.2f} ms a micro-batch of {args.micro} pairs ({args.pairs})")


if __name__ == "__main__":
    main()
