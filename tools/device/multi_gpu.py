"""Two measures on a machine of several GPUs (or CPU ranks): loss parity and scaling.

    python tools/device/multi_gpu.py parity CONFIG --nproc N [--layout KEY=VALUE ...] [--reference KEY=VALUE ...]
        [--set KEY=VALUE ...]
    python tools/device/multi_gpu.py scaling CONFIG --nproc 1,2,4,8 [--set KEY=VALUE ...]

Both run ``ktrain bench`` (synthetic rows) in fresh processes and print a table; ``--json FILE`` keeps it.

parity: the config with the ``--layout`` keys (FSDP2, HSDP, TP, CP, Ulysses SP, a ZeRO stage) on N ranks,
against the config alone on one rank with ``gradient_accumulation_steps`` multiplied by the layout's
data-parallel ranks. Both train the same global batch of the same rows: ``ktrain.bench.rows.SyntheticRows``
lays a step's rows out rank by rank, then micro-batch by micro-batch, so the one-rank run's accumulation
steps are the ranks' micro-batches in order. The first loss (before any update) and the last (after the
warm-up and timed updates) must agree to ``--rtol``; ``--set`` keys go to both runs, ``--reference`` keys to
the one-rank run only (a config that holds its own layout, such as configs/hsdp_tp.yaml, sets its mesh
sizes back to 1 there).

scaling: the config on each rank count of ``--nproc``, the global batch growing with the data-parallel
ranks; tokens/s per device and its share of the one-rank figure (the aim: at least 90% at 8 GPUs
for FSDP2).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any


def bench(config: str, nproc: int, keys: list[str], steps: int, warmup: int) -> dict[str, Any]:
    """The JSON report of ``ktrain bench CONFIG --synthetic`` on ``nproc`` ranks with ``keys`` set."""
    with tempfile.TemporaryDirectory(prefix="ktrain-multi-gpu-") as tmp:
        out = Path(tmp) / "report.json"
        command = [sys.executable, "-m", "ktrain.cli", "bench", config, "--synthetic", "--json", str(out)]
        command += ["--steps", str(steps), "--warmup", str(warmup), "--nproc-per-node", str(nproc)]
        for key in keys:
            command += ["--set", key]
        done = subprocess.run(command, capture_output=True, text=True)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stderr[-4000:]}")
        return json.loads(out.read_text(encoding="utf-8"))


def parity(args: argparse.Namespace) -> dict[str, Any]:
    """The layout on ``args.nproc`` ranks against one rank on the same global batch."""
    ranks = bench(args.config, args.nproc, [*args.set, *args.layout], args.steps, args.warmup)
    accumulation = ranks["gradient_accumulation_steps"] * ranks["data_parallel"]
    reference = [*args.set, *args.reference, f"gradient_accumulation_steps={accumulation}"]
    one = bench(args.config, 1, reference, args.steps, args.warmup)
    rows = []
    for loss in ("first_loss", "last_loss"):
        theirs, ours = one["ktrain"][loss], ranks["ktrain"][loss]
        rows.append({"loss": loss, "one_rank": theirs, "ranks": ours, "rel_diff": abs(ours - theirs) / abs(theirs)})
    ok = all(row["rel_diff"] <= args.rtol for row in rows)
    print(f"{args.config} {' '.join(args.layout)} on {ranks['mesh']} against 1 rank x {accumulation} accumulation")
    for row in rows:
        print(f"  {row['loss']:10} one rank {row['one_rank']:.6f}  ranks {row['ranks']:.6f}  rel {row['rel_diff']:.1e}")
    print(f"  {'agree' if ok else 'DIFFER'} within rtol {args.rtol:g}")
    return {"layout": args.layout, "mesh": ranks["mesh"], "rtol": args.rtol, "rows": rows, "agree": ok}


def scaling(args: argparse.Namespace) -> dict[str, Any]:
    """tokens/s per device on each rank count, and its share of the one-rank figure."""
    counts = [int(n) for n in args.nproc.split(",")]
    sides = [bench(args.config, n, args.set, args.steps, args.warmup)["ktrain"] for n in counts]
    base = sides[0]["tokens_per_s_per_device"]
    rows = [
        {
            "ranks": n,
            "tokens_per_s": side["tokens_per_s"],
            "per_device": side["tokens_per_s_per_device"],
            "share": side["tokens_per_s_per_device"] / base,
            "mfu": side["mfu"],
            "peak_memory_gib": side["peak_memory_gib"],
        }
        for n, side in zip(counts, sides, strict=True)
    ]
    print(f"{args.config} {' '.join(args.set)}")
    print(f"  {'ranks':>5} {'tokens/s':>10} {'per device':>11} {'of the first':>12}")
    for row in rows:
        print(f"  {row['ranks']:>5} {row['tokens_per_s']:>10,.0f} {row['per_device']:>11,.0f} {row['share']:>12.1%}")
    return {"set": args.set, "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="measure", required=True)
    for name in ("parity", "scaling"):
        p = sub.add_parser(name)
        p.add_argument("config")
        p.add_argument("--nproc", required=True, help="ranks (parity) or rank counts, comma-separated (scaling)")
        p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="a key for every run")
        p.add_argument("--steps", type=int, default=4)
        p.add_argument("--warmup", type=int, default=1)
        p.add_argument("--json", type=Path, metavar="FILE")
        if name == "parity":
            p.add_argument("--layout", action="append", default=[], metavar="KEY=VALUE", help="the N-rank run's")
            p.add_argument("--reference", action="append", default=[], metavar="KEY=VALUE", help="the 1-rank run's")
            p.add_argument("--rtol", type=float, default=1e-2)
    args = parser.parse_args(argv)
    if args.measure == "parity":
        args.nproc = int(args.nproc)
        result = parity(args)
    else:
        result = scaling(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0 if result.get("agree", True) else 1


if __name__ == "__main__":
    sys.exit(main())
