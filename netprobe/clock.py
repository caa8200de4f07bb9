"""Clocks: the seam that lets timing logic be tested without sleeping."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    """Anything with a monotonic seconds counter."""

    def monotonic(self) -> float:
        """Return seconds from an arbitrary, never-decreasing origin."""
        ...


class MonotonicClock:
    """The real clock: :func:`time.monotonic`."""

    def monotonic(self) -> float:
        """Return ``time.monotonic()``."""
        return time.monotonic()


class ManualClock:
    """A clock that only moves when told to; for tests and simulations.

    Args:
        start: The initial reading, in seconds.
    """

    def __init__(self, start: float = 0.0) -> None:
        self._now = start

    def monotonic(self) -> float:
        """Return the current manual reading."""
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (which must not be negative)."""
        if seconds < 0:
            raise ValueError("a monotonic clock cannot go backwards")
        self._now += seconds
