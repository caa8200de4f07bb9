"""Leaving gracefully (scale-in): a mixin of :class:`~chaos_edge.trainer.api.Trainer`."""

from __future__ import annotations

import contextlib
import logging
import os
import time

from chaos_edge.trainer.parts import TrainerParts
from chaos_edge.trainer.poller import POLL_S
from daemon.contracts.errors import ControlFailure

log = logging.getLogger("chaos.trainer")
LEAVE_LINGER_S = 0.5  # after the drain, before closing the links
DRAIN_MAX_S = 30.0  # a leaver waits at most this long for the policy that drops it


class _Left(Exception):
    """While leaving, the policy without this node took over (ends the drain)."""


class Leaving(TrainerParts):
    """``request_node_exit`` and its drain (mixed into the Trainer)."""

    _state: str
    timeout: float

    def update(self, samples: int | None = None) -> None:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def request_node_exit(self) -> None:
        """Leave gracefully (scale-in), then close the links.

        The scheduler publishes the policy without us for a step boundary a step or two
        ahead, as for every planned change. Until it governs our next round we take part in
        the rounds with no samples (a zero gradient that the global sample count ignores),
        so that no neighbour ever waits for us: the leave costs the others no stall. Then we
        linger briefly, so that neighbours drop their links to us first, and close.
        """
        try:
            self._s.flush_reports()
            self._s.client.call("worker.leave", {"step": self._replica.step})
            self._state = "leaving"
            if not self._drain(self._clock.monotonic() + min(self.timeout, DRAIN_MAX_S)):
                return  # still attached: our exit is a worker-exit, which drops us at once
            deadline = self._clock.monotonic() + LEAVE_LINGER_S
            while self._s.links.connected() and self._clock.monotonic() < deadline:
                time.sleep(POLL_S)
            self._s.poller.stop()  # a poll after the detach would be refused
            with contextlib.suppress(ControlFailure):  # a daemon that is gone detached us
                self._s.client.call("worker.detach", {"pid": os.getpid()})
        finally:
            self.close()

    def _drain(self, deadline: float) -> bool:
        """Run no-sample rounds until a policy without us governs our next round; False if
        that did not happen in time."""
        while self._clock.monotonic() < deadline:
            self._poll()
            pub, newest = self._s.book.for_round(self._replica.step + 1), self._s.book.newest
            if pub is None or self.node_id not in pub.members:
                return True
            if newest is not None and newest.members == (self.node_id,):
                return True  # the last member: nobody waits for us
            self.optimizer.zero_grad(set_to_none=True)
            try:
                self.update(samples=0)
            except _Left:
                return True
        log.warning("%s left without the policy that drops it (the scheduler did not "
                    "answer in time); the others will see a failure", self.node_id)
        return False
