"""A box slowed by its owner's other work, as the benches and tests make one: a file holds
milliseconds of extra compute a step while it exists."""

from __future__ import annotations

import time
from pathlib import Path

POLL_S = 0.5  # how often the file is read


class SlowDown:
    """Extra compute a step from ``path`` (read at most every POLL_S; absent or empty: none).

    The worker sleeps it before ``update()``, where its daemon counts it as the step's compute
    (``chaos_edge.trainer.timing``), as a throttled CPU would be counted."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._ms, self._read_at = 0.0, 0.0

    def ms(self) -> float:
        now = time.monotonic()
        if now >= self._read_at:
            try:
                self._ms = float(self.path.read_text() or 0)
            except (FileNotFoundError, ValueError):
                self._ms = 0.0
            self._read_at = now + POLL_S
        return self._ms

    def sleep(self) -> None:
        if (ms := self.ms()) > 0:
            time.sleep(ms / 1000.0)
