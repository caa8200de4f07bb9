"""The simulator's event loop: one clock, one seeded random stream, one ordered queue.

Everything that happens in a simulated run is an event on this queue: an agent's tick, a
message reaching a subscriber, a worker's poll, a fault. Events run in time order, ties in the
order they were scheduled, so a run is a function of its seed and nothing else. The clock is
the :class:`~daemon.contracts.clock.FakeClock` every simulated agent reads.
"""

from __future__ import annotations

import hashlib
import heapq
import random
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from daemon.contracts.clock import FakeClock


class HarnessError(RuntimeError):
    """The simulation itself broke (a coroutine that awaited real I/O, a replay that differs):
    a bug of the harness, never a finding about the protocol."""


def drive(coro: Awaitable[Any]) -> Any:
    """Run a coroutine that must finish without suspending (the simulated bus never makes
    anyone wait); returns its value.

    Raises:
        HarnessError: It suspended: something in it awaited real time or real I/O.
    """
    if not isinstance(coro, Coroutine):
        raise HarnessError(f"{coro!r} is not a coroutine")
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    name = getattr(coro, "__qualname__", repr(coro))
    coro.close()
    raise HarnessError(f"{name} suspended: real I/O or sleep in simulated code")


class Sim:
    """The queue of events, the clock they move, the random stream, and the trace.

    Args:
        seed: Drives every random choice of the run.
        trace: Keep a readable line per traced event (else only their digest is kept).
    """

    def __init__(self, seed: int, trace: bool = False) -> None:
        self.seed = seed
        self.rng = random.Random(seed)
        self.clock = FakeClock()
        self._start = self.clock.monotonic()
        self._queue: list[tuple[float, int, Callable[[], None]]] = []
        self._seq = 0
        self.events = 0
        self.lines: list[str] | None = [] if trace else None
        self._digest = hashlib.blake2b(digest_size=16)

    @property
    def now(self) -> float:
        """Seconds since the run began."""
        return self.clock.monotonic() - self._start

    def at(self, delay: float, fn: Callable[[], None]) -> None:
        """Run ``fn`` ``delay`` seconds from now."""
        self._seq += 1
        heapq.heappush(self._queue, (self.now + max(0.0, delay), self._seq, fn))

    def run_until(self, end: float, after_each: Callable[[], None] | None = None) -> None:
        """Run events until simulated time ``end`` (``after_each`` after every one)."""
        while self._queue and self._queue[0][0] <= end:
            t, _, fn = heapq.heappop(self._queue)
            if t > self.now:
                self.clock.advance(t - self.now)
            self.events += 1
            fn()
            if after_each is not None:
                after_each()
        if end > self.now:
            self.clock.advance(end - self.now)

    def note(self, what: str) -> None:
        """One line of the run's trace: what happened at this instant."""
        line = f"{self.now:9.3f} {what}"
        self._digest.update(line.encode())
        if self.lines is not None:
            self.lines.append(line)

    @property
    def digest(self) -> str:
        """A digest of the whole trace: two runs of one seed must agree on it."""
        return self._digest.hexdigest()
