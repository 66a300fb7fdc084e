"""Means of the SM clock, power and temperature over time windows of an ``nvidia-smi`` log.

    python tools/device/smi_windows.py SMI.csv LABEL=HH:MM:SS-HH:MM:SS [...] [--busy-watts 600]

SMI.csv is what tools/device/power_cap.sh writes (``nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,
power.draw,power.limit,temperature.gpu,clocks_event_reasons.active --format=csv -lms 250``). Within each
window only the samples above ``--busy-watts`` count (the device at work, not loading or compiling); a
window with none says so and gives its highest power. "power-capped" is the share of those samples whose
clock-event reasons include the software power cap (0x4) or the hardware power brake (0x80).
"""

from __future__ import annotations

import argparse
import csv


def seconds(clock: str) -> float:
    """Seconds since midnight of ``HH:MM:SS[.fff]``."""
    h, m, s = clock.split(":")
    return int(h) * 3600 + int(m) * 60 + float(s)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("log")
    parser.add_argument("windows", nargs="+", help="LABEL=HH:MM:SS-HH:MM:SS")
    parser.add_argument("--busy-watts", type=float, default=600.0)
    args = parser.parse_args()
    samples = []
    with open(args.log, newline="") as log:
        for row in csv.reader(log):
            if row[0].startswith("timestamp"):
                continue
            when = seconds(row[0].split()[1])
            clock, watts, temperature = float(row[1].split()[0]), float(row[3].split()[0]), float(row[5])
            samples.append((when, clock, watts, temperature, int(row[6].strip(), 16) & 0x84 != 0))
    for window in args.windows:
        label, span = window.split("=")
        begin, end = (seconds(t) for t in span.split("-"))
        inside = [s for s in samples if begin <= s[0] <= end]
        busy = [s for s in inside if s[2] > args.busy_watts]
        if not busy:
            top = max((s[2] for s in inside), default=0.0)
            print(f"{label}: no sample over {args.busy_watts:.0f} W (highest {top:.0f} W)")
            continue
        n = len(busy)
        clock, watts, temperature, capped = (sum(column) / n for column in list(zip(*busy, strict=True))[1:])
        print(f"{label}: {n} samples, SM clock {clock:,.0f} MHz, {watts:.0f} W, {temperature:.1f} C, ", end="")
        print(f"power-capped {capped:.0%}")


if __name__ == "__main__":
    main()
