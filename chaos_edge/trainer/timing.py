"""Where each ``update()`` spends its time, and the stall it reports to the scheduler."""

from __future__ import annotations

from typing import NamedTuple

from chaos_edge.trainer.session import Session
from daemon.contracts.clock import Clock
from daemon.contracts.protocol import Stall


class StepTiming(NamedTuple):
    """Where one ``update()`` spent its time.

    Attributes:
        step: The step it committed.
        stall_ms: Time beyond the collectives (polling chaosd, waiting for a policy, reruns'
            overhead, ``optimizer.step()``, a snapshot for a new node).
        reruns: Rounds aborted and rerun before it committed.
        total_ms: The whole call.
        sync_ms: Time in the collectives (agreement and all-reduce), waits for peers included.
    """

    step: int
    stall_ms: float
    reruns: int
    total_ms: float
    sync_ms: float


class StallMeter:
    """Accounts each ``update()``'s time, keeps the last 10,000 (``trainer.stalls``), and
    reports the stalls the scheduler charges to scale events.

    Args:
        session: The worker's session (reports, and the poller that carries sync times).
        clock: The time source the update was timed with.
    """

    def __init__(self, session: Session, clock: Clock) -> None:
        self._s, self._clock = session, clock
        self.stalls: list[StepTiming] = []
        self._timed_version = 0  # policy version of the step accounted last

    def account(self, t0: float, spent: float, reruns: int, reason: str, *, step: int,
                version: int) -> None:  # fmt: skip
        """One ``update()`` that began at ``t0``, spent ``spent`` seconds in collectives and
        committed ``step`` under policy ``version`` after ``reruns`` reruns (the last one
        for ``reason``)."""
        total_ms = (self._clock.monotonic() - t0) * 1e3
        stall_ms = max(0.0, total_ms - spent * 1e3)
        self.stalls.append(StepTiming(step, stall_ms, reruns, total_ms, spent * 1e3))
        self._s.poller.record_sync(spent * 1e3)
        del self.stalls[:-10_000]
        # The scheduler adds a stall to the event that made its policy, so only the first
        # step under a new policy (or a rerun) says something. Reporting every slow step
        # charged every event with the worst step of its whole policy, and cost each step a
        # control call and an MQTT message.
        first = version != self._timed_version
        self._timed_version = version
        if reruns or (first and stall_ms > 1.0):
            self._s.report(Stall(step=step, ms=round(stall_ms, 3), reruns=reruns,
                                 policy_version=version, reason=reason[:200]))
