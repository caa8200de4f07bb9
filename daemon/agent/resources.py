"""Local resources for heartbeats: CPU, memory and battery, via psutil."""

from __future__ import annotations

from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Resources:
    cpu_percent: float
    mem_percent: float
    battery_percent: float | None


def sample() -> Resources:
    """A cheap, non-blocking reading (cpu_percent since the previous call)."""
    battery: float | None = None
    try:
        bat = psutil.sensors_battery()
    except (AttributeError, NotImplementedError, OSError):  # no sensor support on this box
        bat = None
    if bat is not None:
        battery = float(bat.percent)
    return Resources(
        cpu_percent=float(psutil.cpu_percent(interval=None)),
        mem_percent=float(psutil.virtual_memory().percent),
        battery_percent=battery,
    )
