"""A log line per burst, not per message: counted events, logged at most once per interval.

A flood of bad input (forged, malformed or unknown messages) must not become a flood of log
lines: each :class:`RateLimitedLog` counts what it is told and writes one warning with the
count and the last example, at once for the first and then at most once per ``every_s``.
"""

from __future__ import annotations

import logging

from daemon.contracts.clock import Clock


class RateLimitedLog:
    """Counts events and logs them in batches (call :meth:`flush` now and then)."""

    def __init__(self, logger: logging.Logger, fmt: str, clock: Clock,
                 every_s: float = 10.0) -> None:
        """``fmt`` takes two arguments: the count since the last line, and the last event."""
        self.logger, self.fmt, self.clock, self.every_s = logger, fmt, clock, every_s
        self.total = 0
        self._count = 0
        self._last = ""
        self._logged_at: float | None = None

    def note(self, what: str) -> None:
        """One more event (``what`` describes it, in one line)."""
        self.total += 1
        self._count += 1
        self._last = what[:300]
        self.flush()

    def flush(self) -> None:
        """Write the pending count if the interval since the last line has passed."""
        now = self.clock.monotonic()
        if not self._count or (self._logged_at is not None
                               and now - self._logged_at < self.every_s):
            return
        self.logger.warning(self.fmt, self._count, self._last)
        self._count, self._last, self._logged_at = 0, "", now
