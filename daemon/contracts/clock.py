"""Clocks: the seam through which tests drive time-dependent logic."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals, wall time for timestamps shown to people."""

    def monotonic(self) -> float: ...

    def wall(self) -> float: ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()


class FakeClock:
    """A clock that moves only when a test says so."""

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def monotonic(self) -> float:
        return self._now

    def wall(self) -> float:
        return 1_700_000_000.0 + self._now

    def advance(self, seconds: float) -> None:
        self._now += seconds
