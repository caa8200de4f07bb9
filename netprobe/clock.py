"""Clocks: the one seam through which tests drive time-dependent logic.

It lives here, at the bottom of the import order (netprobe, then daemon, then chaosctl), so
that the probes, the daemon, the cluster logic and the Trainer all take the same ``Clock``;
:mod:`daemon.contracts.clock` re-exports it.
"""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Monotonic time for intervals, wall time for timestamps shown to people."""

    def monotonic(self) -> float:
        """Seconds from an arbitrary, never-decreasing origin."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch."""
        ...


class SystemClock:
    """The real clock."""

    def monotonic(self) -> float:
        """``time.monotonic()``."""
        return time.monotonic()

    def wall(self) -> float:
        """``time.time()``."""
        return time.time()


class FakeClock:
    """A clock that moves only when told to; for tests and simulations.

    Args:
        start: The initial monotonic reading, in seconds.
    """

    def __init__(self, start: float = 1000.0) -> None:
        self._now = start

    def monotonic(self) -> float:
        """The current manual reading."""
        return self._now

    def wall(self) -> float:
        """A fixed epoch plus the manual reading."""
        return 1_700_000_000.0 + self._now

    def advance(self, seconds: float) -> None:
        """Move the clock by ``seconds`` (tests may step back to replay a moment)."""
        self._now += seconds
