"""The worker's membership: joining, active, leaving, and back to joining when dropped.

:class:`Membership` holds the worker's own state (``WorkerState``, told to chaosd with every
poll) and its transitions::

    joining --a policy names it (Joiner)--> active --request_node_exit()--> leaving
       ^                                      |                        (drain, then detach)
       +--dropped from the policy of its next round: rejoin with a fresh replica

A join is the :class:`~chaos_edge.trainer.joiner.Joiner`'s (its own phases are in
:mod:`~chaos_edge.trainer.scaleout`). A dropped member (declared failed, or on the losing side
of a partition) may hold a stale state, so only a fresh replica lets it back in. The graceful
leave (scale-in): chaosd is told (``worker.leave``), then :func:`drain` runs rounds with no
samples until the policy without this node governs its next round, so that no neighbour ever
waits for it, and :func:`detach` lingers until the neighbours have dropped their links.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable

from chaos_edge.trainer.joiner import Joiner
from chaos_edge.trainer.poller import POLL_S
from chaos_edge.trainer.scaleout import standing
from chaos_edge.trainer.session import Session
from chaos_edge.trainer.timing import StepAlarm
from daemon.contracts.clock import Clock
from daemon.contracts.errors import ControlFailure
from daemon.contracts.kinds import WorkerState
from daemon.contracts.policy import SyncPolicy

log = logging.getLogger("chaos.trainer")
LEAVE_LINGER_S = 0.5  # after the drain, before closing the links
DRAIN_MAX_S = 30.0  # a leaver waits at most this long for the policy that drops it


class Left(Exception):
    """While leaving, the policy without this node took over (ends the drain)."""


class Membership:
    """The worker's state, and the moves between member and not (module docstring).

    Args:
        me: This node's id.
        session: The worker's session (attach, the policy book, leave and detach).
        joiner: Carries out each join.
        clock: The time source of the deadlines.
        join_timeout: Seconds a rejoin may take.
        step: Callback: the last committed step.
        poll: Callback: take in what the poller fetched (the Trainer's ``_poll``).
        joined: Callback after each join, with whether a replicated state was restored.
    """

    def __init__(self, me: str, session: Session, joiner: Joiner, clock: Clock, *,
                 join_timeout: float, step: Callable[[], int], poll: Callable[[], None],
                 joined: Callable[[bool], None]) -> None:  # fmt: skip
        self.me, self._s, self._joiner, self._clock = me, session, joiner, clock
        self.join_timeout = join_timeout
        self._step, self._poll, self._joined = step, poll, joined
        self.state: WorkerState = "joining"
        self.joins = 0  # completed joins (a rejoin inside update() voids its gradient)

    def join(self, deadline: float) -> None:
        """Block until this node is a member; then it is ``active``."""
        restored = self._joiner.join(deadline, was_member=self.joins > 0)
        self.state = "active"
        self.joins += 1
        self._joined(restored)

    def policy(self, alarm: StepAlarm) -> SyncPolicy:
        """The policy of round ``step + 1``; rejoins if this node was dropped from it. Waits
        as long as it takes, ringing ``alarm`` at each step timeout.

        Raises:
            Left: We are leaving, and the policy without us governs: the leave is done.
        """
        while True:
            step = self._step()
            pub = self._s.book.for_round(step + 1)
            verdict = standing(pub, self.me, leaving=self.state == "leaving")
            if verdict == "member" and pub is not None and self._s.poller.in_touch:
                return pub
            if verdict == "left":
                raise Left
            if verdict == "rejoin" and pub is not None:
                # Our state may be stale. That holds even when a newer policy adds us back (a
                # link back to a partitioned node): the rounds before it run without us, and
                # we used to wait for them until the step timeout. A newer policy that leaves
                # us out too changes nothing either.
                log.warning("%s is not in policy v%d; asking to rejoin", self.me, pub.version)
                self.state = "joining"
                # A fresh join request, saying which state we hold: a replicate comes back
                # (or, with no member left, a bootstrap from our own state).
                self._s.attach(step)
                self.join(self._clock.monotonic() + self.join_timeout)
                continue
            alarm.check(step + 1, "chaosd is out of touch with the cluster (no broker, or its "
                        "own heartbeats do not come back)" if verdict == "member" else
                        "no sync policy for it has arrived")
            self._s.wait(POLL_S)
            self._poll()

    def leave(self, timeout: float, empty_round: Callable[[], None],
              served: Callable[[], int] = lambda: 0) -> None:
        """Leave gracefully: tell chaosd, drain, detach (the caller closes the links).

        The scheduler publishes the policy without us for a step boundary a step or two
        ahead, as for every planned change. Until it governs our next round we take part in
        the rounds with no samples (``empty_round``, which raises :class:`Left` once that
        policy governs), so that no neighbour ever waits for us: the leave costs the others
        no stall. Then we linger briefly, so that neighbours drop their links to us first.
        The last member that is the source of a join leaves once the new node holds the
        state (the scheduler holds its leave till then); while the bytes we serve grow
        (``served``: the total so far) the drain's deadline moves on, so the transfer of a
        large state is not cut off.
        """
        self._s.flush_reports()
        self._s.client.call("worker.leave", {"step": self._step()})
        self.state = "leaving"
        if self._drain(min(timeout, DRAIN_MAX_S), empty_round, served):
            self._detach()
        # Else we are still attached: our exit is a worker-exit, which drops us at once.

    def _drain(self, limit: float, empty_round: Callable[[], None],
               served: Callable[[], int]) -> bool:
        """Run no-sample rounds until a policy without us governs our next round; False if
        that did not happen within ``limit`` seconds (of the last byte we served)."""
        deadline, sent = self._clock.monotonic() + limit, served()
        while self._clock.monotonic() < deadline:
            if (now_sent := served()) > sent:
                sent, deadline = now_sent, max(deadline, self._clock.monotonic() + limit)
            self._poll()
            pub, newest = self._s.book.for_round(self._step() + 1), self._s.book.newest
            if pub is None or self.me not in pub.members:
                return True
            if newest is not None and newest.members == (self.me,):
                return True  # the last member: nobody waits for us
            try:
                empty_round()
            except Left:
                return True
        log.warning("%s left without the policy that drops it (the scheduler did not "
                    "answer in time); the others will see a failure", self.me)
        return False

    def _detach(self) -> None:
        """Linger until the neighbours have dropped their links to us (bounded), then
        detach from chaosd."""
        deadline = self._clock.monotonic() + LEAVE_LINGER_S
        while self._s.links.connected() and self._clock.monotonic() < deadline:
            time.sleep(POLL_S)
        self._s.poller.stop()  # a poll after the detach would be refused
        with contextlib.suppress(ControlFailure):  # a daemon that is gone detached us
            self._s.client.call("worker.detach", {"pid": os.getpid()})
