"""A token bucket that paces a sender, so benchmarks can make the network the bottleneck."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable


class TokenBucket:
    """Pace writes to ``rate`` bytes per second with bursts of at most ``burst`` bytes.

    Thread-safe: connections that share a link share one bucket. The clock and the sleep are
    injectable so tests can drive time.

    Args:
        rate: Bytes per second (> 0).
        burst: Bucket depth in bytes; 10 ms of traffic (at least 64 KiB) when None.
        clock: Monotonic clock in seconds.
        sleep: Sleeps for the given seconds.
    """

    def __init__(
        self,
        rate: float,
        burst: float | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not rate > 0:
            raise ValueError(f"rate must be > 0 bytes/s, got {rate}")
        self.rate = float(rate)
        self.burst = float(burst) if burst is not None else max(65536.0, rate * 0.01)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        # When everything reserved so far has drained at ``rate``; a sender may run at most
        # ``burst`` bytes ahead of it, and an idle link earns no credit beyond that.
        self._free_at = clock()

    def reserve(self, nbytes: int) -> float:
        """Take ``nbytes`` of tokens now; returns how long the caller must wait to send them."""
        with self._lock:
            now = self._clock()
            self._free_at = max(self._free_at, now) + nbytes / self.rate
            return max(0.0, self._free_at - self.burst / self.rate - now)

    def consume(self, nbytes: int) -> None:
        """Block until ``nbytes`` may be sent."""
        wait = self.reserve(nbytes)
        if wait > 0:
            self._sleep(wait)


def slices(total: int, size: int) -> list[tuple[int, int]]:
    """``(start, length)`` pieces of ``size`` bytes (the last may be shorter) covering ``total``."""
    return [(i, min(size, total - i)) for i in range(0, total, size)]
