"""Phi-accrual failure detection (Hayashibara et al.; Akka's variant).

Each monitored node keeps its own window of heartbeat inter-arrival times, so the cost and the
detection time per node do not depend on the cluster's size. ``phi`` is ``-log10`` of the
probability that a heartbeat is still to come after the silence so far, under a normal model
of the intervals whose mean is padded by ``acceptable_pause_s`` (tolerating GC or Wi-Fi
hiccups) and whose deviation is floored by ``min_std_s`` (so a perfectly regular sender is not
declared dead one jitter after its usual interval).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from daemon.contracts.clock import Clock
from daemon.contracts.config import DetectorConfig


@dataclass
class _History:
    last: float
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=100))
    # The last arrival was a stand-in (a node seen "up"), not a heartbeat: the gap to the
    # first real one says nothing about the sender's rhythm.
    seeded: bool = False


def phi(elapsed: float, mean: float, std: float) -> float:
    """-log10 of P(a heartbeat comes later than ``elapsed``), Akka's logistic approximation.

    P(later) = 1 / (1 + exp(z)) with z = y(1.5976 + 0.070566 y^2), y = (elapsed - mean) / std,
    so phi = softplus(z) / ln 10, computed in a form that never overflows.
    """
    y = (elapsed - mean) / std
    z = y * (1.5976 + 0.070566 * y * y)
    softplus = max(z, 0.0) + math.log1p(math.exp(-abs(z)))
    return softplus / math.log(10.0)


class PhiAccrualDetector:
    """Tracks heartbeats of many nodes and says which ones are suspected dead."""

    def __init__(self, cfg: DetectorConfig, clock: Clock) -> None:
        self._cfg = cfg
        self._clock = clock
        self._nodes: dict[str, _History] = {}

    def heartbeat(self, node: str, *, seed: bool = False) -> None:
        """Record a heartbeat from ``node`` now.

        Args:
            node: the sender.
            seed: this is a sign of life, not a heartbeat (start the clock, learn nothing).
        """
        now = self._clock.monotonic()
        hist = self._nodes.get(node)
        if hist is None:
            hist = _History(last=now, seeded=seed)
            # Seed with the nominal interval so the first verdicts are sane.
            hist.intervals.append(self._cfg.heartbeat_interval_s)
            self._nodes[node] = hist
            return
        if not hist.seeded and not seed:
            hist.intervals.append(now - hist.last)
        hist.seeded = seed
        hist.last = now

    def forget(self, node: str) -> None:
        self._nodes.pop(node, None)

    def reset_all(self) -> None:
        """Treat every node as just heard from: after our own reconnect, their silence was ours."""
        now = self._clock.monotonic()
        for hist in self._nodes.values():
            hist.last = now
            hist.seeded = True

    def age(self, node: str) -> float | None:
        """Seconds since the last heartbeat of ``node``, or None if never heard."""
        hist = self._nodes.get(node)
        return None if hist is None else self._clock.monotonic() - hist.last

    def phi(self, node: str, until: float | None = None) -> float:
        """The suspicion of ``node``, for its silence up to ``until`` (default: now).

        A caller that knows its own path worked only until some moment (its own heartbeat
        last came back through the broker then) passes that moment: silence after it may be
        ours, not the node's.
        """
        hist = self._nodes.get(node)
        if hist is None:
            return 0.0
        n = len(hist.intervals)
        mean = sum(hist.intervals) / n
        var = sum((x - mean) ** 2 for x in hist.intervals) / n
        std = max(math.sqrt(var), self._cfg.min_std_s)
        end = self._clock.monotonic() if until is None else min(until, self._clock.monotonic())
        return phi(max(end - hist.last, 0.0), mean + self._cfg.acceptable_pause_s, std)

    def is_alive(self, node: str, until: float | None = None) -> bool:
        return node in self._nodes and self.phi(node, until) < self._cfg.phi_threshold

    def suspects(self) -> list[str]:
        """Nodes whose phi crossed the threshold, sorted."""
        return sorted(n for n in self._nodes if self.phi(n) >= self._cfg.phi_threshold)

    def known(self) -> list[str]:
        return sorted(self._nodes)
