"""``ktrain plot RUN_DIR``: a run's loss and eval loss, learning rate and tokens/s, drawn from metrics.jsonl."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

PANELS = (
    ("loss", ("loss", "eval_loss")),
    ("learning rate", ("lr",)),
    ("tokens/s", ("tokens_per_s",)),
)


def configure(parser: argparse.ArgumentParser) -> None:
    """The arguments of ``ktrain plot``."""
    parser.add_argument("run_dir", help="output_dir of a run (it holds metrics.jsonl)")
    parser.add_argument("--output", help="PNG to write (default: RUN_DIR/metrics.png)")


def series(path: Path) -> dict[str, tuple[list[int], list[float]]]:
    """metric -> (steps, values) of the metrics.jsonl at ``path``."""
    out: dict[str, tuple[list[int], list[float]]] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        record = json.loads(line)
        for name, value in record.items():
            if name != "step":
                steps, values = out.setdefault(name, ([], []))
                steps.append(record["step"])
                values.append(value)
    return out


def figure(data: dict[str, tuple[list[int], list[float]]], title: str) -> Any:
    """A matplotlib Figure with one panel per entry of ``PANELS``; a metric the run did not log is left out."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 2.2 * len(PANELS)), layout="constrained")
    fig.suptitle(title)
    for ax, (label, names) in zip(fig.subplots(len(PANELS), 1, sharex=True), PANELS, strict=True):
        for name in names:
            if name in data:
                steps, values = data[name]
                ax.plot(steps, values, marker="o" if name == "eval_loss" else None, label=name)
        ax.set_ylabel(label)
        if len(names) > 1:
            ax.legend()
    ax.set_xlabel("step")
    return fig


def run(args: argparse.Namespace) -> int:
    """Write the PNG; exit code 2 with a message when RUN_DIR has no metrics."""
    run_dir = Path(args.run_dir)
    metrics = run_dir / "metrics.jsonl"
    if not metrics.is_file():
        print(f"ktrain plot: {run_dir} has no metrics.jsonl; give the output_dir of a run", file=sys.stderr)
        return 2
    output = Path(args.output) if args.output else run_dir / "metrics.png"
    figure(series(metrics), run_dir.name).savefig(output, dpi=100)
    print(f"plot written to {output}")
    return 0
