"""Where each ``update()`` spends its time, and the stall it reports to the scheduler."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import NamedTuple, overload

import numpy as np

from chaos_edge.trainer.session import Session
from daemon.contracts.clock import Clock
from daemon.contracts.protocol import RoundStuck, Stall

log = logging.getLogger("chaos.trainer")


class StepTiming(NamedTuple):
    """Where one ``update()`` spent its time.

    Attributes:
        step: The step it committed.
        stall_ms: Time beyond the collectives (polling chaosd, waiting for a policy, reruns'
            overhead, ``optimizer.step()``, a snapshot for a new node).
        reruns: Rounds aborted and rerun before it committed.
        total_ms: The whole call.
        sync_ms: Time in the collectives (agreement and all-reduce), waits for peers included.
        optimizer_ms: The part of ``stall_ms`` in the optimizer step (unscale, the script's
            ``grad_transform``, clipping, ``optimizer.step()``, zeroing the gradients): what
            any training loop pays. ``stall_ms - optimizer_ms`` is the framework's own cost.
    """

    step: int
    stall_ms: float
    reruns: int
    total_ms: float
    sync_ms: float
    optimizer_ms: float = 0.0


class StepLog(Sequence[StepTiming]):
    """The last ``keep`` StepTimings, oldest first, in a ring allocated once: a worker steps
    ten times a second for days, and a list of tuples grew its memory for its first 10,000
    steps (about 2 MiB), which read as a leak in the soak's growth fits."""

    def __init__(self, keep: int = 10_000) -> None:
        self._ring = np.zeros((keep, len(StepTiming._fields)), np.float64)  # ints exact < 2**53
        self._n = 0  # appended in all

    def append(self, t: StepTiming) -> None:
        self._ring[self._n % len(self._ring)] = t
        self._n += 1

    def __len__(self) -> int:
        return min(self._n, len(self._ring))

    @overload
    def __getitem__(self, i: int) -> StepTiming: ...
    @overload
    def __getitem__(self, i: slice) -> list[StepTiming]: ...
    def __getitem__(self, i: int | slice) -> StepTiming | list[StepTiming]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if not -len(self) <= i < len(self):
            raise IndexError("step log index out of range")
        row = self._ring[(self._n - len(self) + i % len(self)) % len(self._ring)]
        return StepTiming(int(row[0]), float(row[1]), int(row[2]), float(row[3]), float(row[4]),
                          float(row[5]))


class StallMeter:
    """Accounts each ``update()``'s time, keeps the last 10,000 (``trainer.stalls``), and
    reports the stalls the scheduler charges to scale events.

    Args:
        session: The worker's session (reports, and the poller that carries sync times).
        clock: The time source the update was timed with.
    """

    def __init__(self, session: Session, clock: Clock) -> None:
        self._s, self._clock = session, clock
        self.stalls = StepLog()
        self._timed_version = 0  # policy version of the step accounted last
        self._ended: float | None = None  # when the last update() returned

    def account(self, t0: float, spent: float, reruns: int, reason: str, *, step: int,
                version: int, optimizer_s: float = 0.0,
                rejoined: bool = False) -> None:  # fmt: skip
        """One ``update()`` that began at ``t0``, spent ``spent`` seconds in collectives
        (``optimizer_s`` in the optimizer step) and committed ``step`` under policy
        ``version`` after ``reruns`` reruns (the last one for ``reason``); ``rejoined``: the
        worker rejoined inside it (dropped, or set aside as a straggler, and back), so the
        step is no measure of its compute."""
        now = self._clock.monotonic()
        total_ms = (now - t0) * 1e3
        stall_ms = max(0.0, total_ms - spent * 1e3)
        self.stalls.append(StepTiming(step, stall_ms, reruns, total_ms, spent * 1e3,
                                      min(stall_ms, optimizer_s * 1e3)))
        self._s.poller.record_sync(spent * 1e3)
        if self._ended is not None and not rejoined:
            # The whole step but the collectives: the script's own work since the last
            # update() returned (data, forward, backward), the optimizer step and the
            # framework's own cost. What a step takes this box whatever the wire: the
            # controller's compute (daemon.cluster.controller).
            # Not a step that rejoined: the wait outside the cluster (20 s aside, once) went
            # into the moving average, and the box read as a straggler 13 s after it was back
            # (tests/testbed/test_straggler_link.py).
            self._s.poller.record_compute((now - self._ended - spent) * 1e3)
        self._ended = now
        # The scheduler adds a stall to the event that made its policy, so only the first
        # step under a new policy (or a rerun) says something. Reporting every slow step
        # charged every event with the worst step of its whole policy, and cost each step a
        # control call and an MQTT message.
        first = version != self._timed_version
        self._timed_version = version
        if reruns or (first and stall_ms > 1.0):
            self._s.report(Stall(step=step, ms=round(stall_ms, 3), reruns=reruns,
                                 policy_version=version, reason=reason[:200]))


class StepAlarm:
    """The step timeout of one ``update()``: an alarm, not an exit.

    A round that cannot commit (a member gone unnoticed, the broker down, a scheduler still
    deciding) holds up every member alike. Raising at the timeout made them all exit together
    and took the cluster's state with them (the soak's faults 4 and 5, and a 15-minute soak
    that started over from a fresh model). Each time ``timeout`` passes with the step not
    done, the worker says so (a warning and a ``round-stuck`` report, which the scheduler
    records as an event) and waits on, holding its state, serving it to joiners and polling
    chaosd, until the round commits or the cluster re-forms around it.

    Args:
        session: Where the report goes.
        clock: The time source of the deadline.
        timeout: Seconds between alarms.
    """

    def __init__(self, session: Session, clock: Clock, timeout: float) -> None:
        self._s, self._clock, self.timeout = session, clock, timeout
        self.since = clock.monotonic()
        self.at = self.since + timeout  # the next alarm, monotonic
        self.rang = 0

    def check(self, step: int, reason: str) -> None:
        """Ring once ``at`` passed (``reason``: what round ``step`` waits on), then re-arm."""
        now = self._clock.monotonic()
        if now <= self.at:
            return
        self.rang += 1
        waited = now - self.since
        log.warning("step %d has not completed for %.0fs (%s); keeping the state and waiting",
                    step, waited, reason)
        self._s.report(RoundStuck(step=step, waited_s=round(waited, 3), reason=reason[:200]))
        self.at = now + self.timeout
