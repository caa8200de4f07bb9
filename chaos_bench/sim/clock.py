"""The daemon's clock seam (:class:`~daemon.contracts.clock.Clock`), read from a SimPy run."""

from __future__ import annotations

import simpy


class SimClock:
    """Monotonic and wall time of the simulation (fixed origins, so runs repeat exactly)."""

    def __init__(self, env: simpy.Environment) -> None:
        self.env = env

    def monotonic(self) -> float:
        return 1000.0 + float(self.env.now)

    def wall(self) -> float:
        return 1_700_000_000.0 + float(self.env.now)
