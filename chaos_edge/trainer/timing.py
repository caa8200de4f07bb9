"""Where each ``update()`` spends its time, and the stall it reports to the scheduler."""

from __future__ import annotations

from typing import NamedTuple

from chaos_edge.trainer.parts import TrainerParts
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


class Timing(TrainerParts):
    """Stall accounting (mixed into the Trainer)."""

    _timed_version: int
    stalls: list[StepTiming]

    def _account(self, t0: float, spent: float, reruns: int, reason: str) -> None:
        total_ms = (self._clock.monotonic() - t0) * 1e3
        stall_ms = max(0.0, total_ms - spent * 1e3)
        self.stalls.append(StepTiming(self._replica.step, stall_ms, reruns, total_ms, spent * 1e3))
        self._s.poller.record_sync(spent * 1e3)
        del self.stalls[:-10_000]
        # The scheduler adds a stall to the event that made its policy, so only the first
        # step under a new policy (or a rerun) says something. Reporting every slow step
        # charged every event with the worst step of its whole policy, and cost each step a
        # control call and an MQTT message.
        first = self._version != self._timed_version
        self._timed_version = self._version
        if reruns or (first and stall_ms > 1.0):
            self._s.report(Stall(step=self._replica.step, ms=round(stall_ms, 3), reruns=reruns,
                                 policy_version=self._version, reason=reason[:200]))
