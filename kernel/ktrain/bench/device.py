"""The GPU's clock, power and temperature while ``ktrain bench`` times steps, read from NVML.

A GPU at its power limit lowers its clock until it draws no more (an H200 training the 1.5B benchmark runs
at 1,565-1,599 MHz of its 1,980 under its 700 W limit: docs/performance.md). Then the step's time follows
its energy, not its kernels' time at the full clock, and two sides of a comparison may run at different
clocks. The report prints what the device did while each side was timed, so that this shows.

A thread samples NVML every ``PERIOD`` seconds between ``start`` and ``stop``; NVML's calls release the
interpreter lock, so the training loop does not wait for it. Needs ``nvidia-ml-py`` (``pynvml``) and a
CUDA device; otherwise ``stop`` returns None and the report says why.
"""

from __future__ import annotations

import threading
from typing import Any

import attrs
import torch

PERIOD = 0.05


@attrs.frozen
class DeviceState:
    """Means over the samples of the timed steps (NVML's power reading is itself an average over its own
    window), and the share of the samples in which NVML named the power limit as holding the clock down."""

    samples: int
    sm_clock_mhz: float
    max_sm_clock_mhz: float
    power_w: float
    power_limit_w: float
    temperature_c: float
    power_capped: float

    def describe(self) -> str:
        """One line of the report."""
        return (
            f"SM clock {self.sm_clock_mhz:,.0f} of {self.max_sm_clock_mhz:,.0f} MHz, {self.power_w:.0f} W of "
            f"{self.power_limit_w:.0f} W, {self.temperature_c:.0f} C; held down by the power limit in "
            f"{self.power_capped:.0%} of {self.samples} samples"
        )


def _nvml_handle(device: torch.device) -> tuple[Any, Any] | str:
    """``(pynvml, handle)`` of ``device``, or why there is none."""
    if device.type != "cuda":
        return "not a CUDA device"
    try:
        import pynvml
    except ImportError:
        return "no NVML bindings here (pip install nvidia-ml-py)"
    try:
        pynvml.nvmlInit()
        uuid = str(torch.cuda.get_device_properties(device).uuid)
        return pynvml, pynvml.nvmlDeviceGetHandleByUUID(uuid if uuid.startswith("GPU-") else f"GPU-{uuid}")
    except pynvml.NVMLError as e:
        return f"NVML: {e}"


class DeviceMonitor:
    """Samples the device between ``start`` and ``stop``; ``why_not`` says why it cannot, when it cannot."""

    def __init__(self, device: torch.device):
        found = _nvml_handle(device)
        self.why_not = found if isinstance(found, str) else None
        self.nvml, self.handle = (None, None) if isinstance(found, str) else found
        if self.nvml is not None:  # the reasons that mean "held down by the power limit"
            self.power_cap_reasons = (
                self.nvml.nvmlClocksEventReasonSwPowerCap | self.nvml.nvmlClocksEventReasonHwPowerBrakeSlowdown
            )
        self.rows: list[tuple[float, float, float, bool]] = []
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def _sample(self) -> None:
        nvml, h = self.nvml, self.handle
        while True:
            try:
                reasons = nvml.nvmlDeviceGetCurrentClocksEventReasons(h)
                row = (
                    nvml.nvmlDeviceGetClockInfo(h, nvml.NVML_CLOCK_SM),
                    nvml.nvmlDeviceGetPowerUsage(h) / 1e3,
                    nvml.nvmlDeviceGetTemperature(h, nvml.NVML_TEMPERATURE_GPU),
                    bool(reasons & self.power_cap_reasons),
                )
            except nvml.NVMLError as e:  # a driver without one of these readings: no state, and why
                self.why_not, self.rows = f"NVML: {e}", []
                return
            self.rows.append(row)
            if self.stopping.wait(PERIOD):
                return

    def start(self) -> None:
        if self.handle is None:
            return
        self.rows, self.stopping = [], threading.Event()
        self.thread = threading.Thread(target=self._sample, name="ktrain-bench-nvml", daemon=True)
        self.thread.start()

    def stop(self) -> DeviceState | None:
        """The state over the samples since ``start`` (None without NVML, or without a sample)."""
        if self.thread is None:
            return None
        self.stopping.set()
        self.thread.join()
        self.thread = None
        if not self.rows:
            return None
        n = len(self.rows)
        clock, power, temperature, capped = (sum(column) / n for column in zip(*self.rows, strict=True))
        nvml, h = self.nvml, self.handle
        return DeviceState(
            samples=n,
            sm_clock_mhz=clock,
            max_sm_clock_mhz=nvml.nvmlDeviceGetMaxClockInfo(h, nvml.NVML_CLOCK_SM),
            power_w=power,
            power_limit_w=nvml.nvmlDeviceGetEnforcedPowerLimit(h) / 1e3,
            temperature_c=temperature,
            power_capped=capped,
        )
