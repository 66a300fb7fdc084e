"""Where a profiled step's device time goes, from the Chrome trace of ``ktrain bench --profile FILE.json.gz``.

    python tools/device/trace_summary.py TRACE.json.gz [--top 30] [--steps 3]

Prints the span from the first kernel to the end of the last; the device's busy time (the union of the
kernels', copies' and sets' intervals, so overlapping streams count once); that time a step by kind of
work (matched by kernel name: ``KINDS``); the kernels that took the most time a step; and the idle gaps
over 0.3 ms with what ran after each (a gap is the device waiting for the host: a synchronization, or
the host launching slower than the device runs), with the operator the host was in at the gap's start and
the runtime calls (synchronizations, copies, allocations) it made during the gap.
"""

from __future__ import annotations

import argparse
import collections
import gzip
import json
import re

DEVICE_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")
KINDS = {  # the first pattern a kernel's name matches names its kind
    "matrix multiplies": r"nvjet|gemm|cutlass|splitK",
    "attention": r"cudnn|fmha|flash|sdpa",
    "optimizer and clipping (multi-tensor kernels)": r"multi_tensor_apply",
    "Liger kernels": r"_rms_norm|_swiglu|liger|_triton_rope|element_mul",
    "copies, casts and sets": r"copy|Memcpy|chunk_cat|Cat|Memset",
}


def kind(name: str) -> str:
    """The kind of work of a kernel, from its name."""
    return next((k for k, pattern in KINDS.items() if re.search(pattern, name)), "other")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace")
    parser.add_argument("--top", type=int, default=30, help="how many kernels to list")
    parser.add_argument("--steps", type=int, default=3, help="steps in the trace (ktrain bench profiles 3)")
    args = parser.parse_args()
    with gzip.open(args.trace, "rb") as trace:
        events = json.load(trace)["traceEvents"]
    work = sorted((e for e in events if e.get("cat") in DEVICE_CATEGORIES and "dur" in e), key=lambda e: e["ts"])
    if not work:
        raise SystemExit(f"{args.trace}: no device kernels in the trace (profiled on a CPU?)")
    start = work[0]["ts"]
    busy = gaps_total = 0.0
    gaps = []
    begin, end = work[0]["ts"], work[0]["ts"] + work[0]["dur"]
    for e in work[1:]:
        if e["ts"] > end:
            busy += end - begin
            if e["ts"] - end > 300:
                gaps.append(((e["ts"] - end) / 1e3, (end - start) / 1e3, e["name"][:70]))
                gaps_total += (e["ts"] - end) / 1e3
            begin = e["ts"]
        end = max(end, e["ts"] + e["dur"])
    busy += end - begin
    n = args.steps
    print(f"{n} steps: span {(end - start) / 1e3:.1f} ms, device busy {busy / 1e3:.1f} ms, {len(work)} kernels")
    by_kind = collections.Counter()
    for e in work:
        by_kind[kind(e["name"])] += e["dur"]
    for name, us in by_kind.most_common():
        print(f"{us / n / 1e3:8.1f} ms/step  {name}")
    time_of, count_of = collections.Counter(), collections.Counter()
    for e in work:
        time_of[e["name"][:90]] += e["dur"]
        count_of[e["name"][:90]] += 1
    for name, us in time_of.most_common(args.top):
        print(f"{us / n / 1e3:8.2f} ms/step  x{count_of[name] // n:4d}  {name}")
    print(f"idle gaps over 0.3 ms: {len(gaps)}, {gaps_total:.1f} ms in all ({gaps_total / n:.1f} ms a step)")
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES and "dur" in e]
    for ms, at, name in sorted(gaps, reverse=True)[:15]:
        print(f"  {ms:.2f} ms at {at:.1f} ms, before {name}; host: {host_during(host, start + at * 1e3, ms * 1e3)}")


def host_during(host: list[dict], begin: float, length: float) -> str:
    """What the host was in while the device idled from ``begin`` for ``length`` us: the innermost operator
    running at the gap's start, and any runtime call (a synchronization, a copy) that overlaps the gap."""
    ops = [e for e in host if e["cat"] == "cpu_op" and e["ts"] <= begin <= e["ts"] + e["dur"]]
    inner = min(ops, key=lambda e: e["dur"])["name"][:50] if ops else "no operator"
    calls = {
        e["name"] for e in host if e["cat"] != "cpu_op" and e["ts"] < begin + length and e["ts"] + e["dur"] > begin
    }
    waits = sorted(c for c in calls if re.search(r"Synchronize|Memcpy|Malloc|Free|Query", c))
    return inner + (f" ({', '.join(waits)})" if waits else "")


if __name__ == "__main__":
    main()
