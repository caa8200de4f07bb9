"""The new node's side of scale-out in the Trainer: become a member, restore the state.

A mixin of :class:`~chaos_edge.trainer.api.Trainer`. The pull itself (offers, plan, fetch) is
:func:`~chaos_edge.trainer.join.pull_state`; this is what the worker does around it: wait for its
``replicate`` command, retry a failed pull, refuse a state that does not fit (before loading
anything), restore the model, optimizer, buffers and registered objects, and wait for the
policy that makes it a member.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from chaos_edge.replication.state import StateSpace
from chaos_edge.trainer.control import StateMismatch, TrainerError
from chaos_edge.trainer.join import pull_state
from chaos_edge.trainer.parts import TrainerParts
from chaos_edge.trainer.poller import POLL_S
from chaos_edge.trainer.shares import Shard
from daemon.contracts.errors import ChaosError
from daemon.contracts.protocol import Bootstrap, StateRefused

log = logging.getLogger("chaos.trainer")
FETCH_RETRY_S = 0.5  # pause before fetching a replicated state again


class Joining(TrainerParts):
    """Join the cluster: bootstrap alone, or restore a replicated state (mixed into Trainer)."""

    _speeds: tuple[int, list[float]] | None
    _shard: Shard | None
    _state: str
    _agreed: tuple[int, int] | None
    _agreed_members: tuple[str, ...] | None
    _was_member: bool
    _joins: int
    _diverged: bool
    join_timeout: float

    def _join(self, deadline: float) -> None:
        """Block until this node is a member: bootstrap alone, or restore a replicated state."""
        rep = None  # the newest replicate command for us; kept until a fetch succeeds
        while True:
            self._poll()
            mine = [r for r in self._s.replications if r.new == self.node_id]
            if mine:
                self._s.replications = [r for r in self._s.replications if r not in mine]
                rep = mine[-1]
            if isinstance(rep, Bootstrap):
                # The scheduler made us the only member: the cluster is new, or every member
                # and source went. A former member's own state, perhaps a little behind,
                # beats none.
                log.info("%s bootstraps the cluster from its own %s", self.node_id,
                         f"state of step {self._replica.step}" if self._was_member else "model")
                self._replica.start_alone()
                self._await_policy(rep, deadline)
                break
            if rep is not None:
                # A failed fetch is retried (the source keeps its offer): a dial race that
                # replaced the link used to lose the only command, and the join hung.
                if self._fetch(rep, deadline):
                    self._await_policy(rep, deadline)
                    break
                time.sleep(FETCH_RETRY_S)
            if self._clock.monotonic() > deadline:
                raise TrainerError(
                    f"{self.node_id} did not become a member within {self.join_timeout:g}s: "
                    "no replicate command arrived; check `chaosctl nodes` and the scheduler"
                )
            self._s.wait(POLL_S)
        # (the replica holds what the snapshot held)
        self._state, self._agreed, self._agreed_members = "active", None, None
        self._was_member = True
        self._joins += 1
        self._diverged = False

    def _await_policy(self, rep: Any, deadline: float) -> None:
        """Wait until we know the policy that makes us a member: the command that brought the
        state may have outrun it (another MQTT topic), and without it the first round would
        find us in no policy and ask to join once more."""
        while True:
            newest = self._s.book.newest
            if newest is not None and (newest.version >= rep.policy_version if
                                       rep.policy_version >= 0 else
                                       self.node_id in newest.members):  # fmt: skip
                return
            if self._clock.monotonic() > deadline:
                raise TrainerError(f"{self.node_id} restored step {self._replica.step}, but "
                                   f"the policy v{rep.policy_version} that adds it never "
                                   "arrived")
            self._s.wait(POLL_S)
            self._poll()

    def _superseded(self) -> bool:
        """(During a fetch.) A newer replicate command for us came: a new scheduler's, or
        the same one's plan with other sources. The next try fetches that one."""
        self._poll()
        return any(r.new == self.node_id for r in self._s.replications)

    def _fetch(self, rep: Any, deadline: float) -> bool:
        """Pull and restore the state ``rep`` names; False (logged) if this try failed.

        Raises:
            StateMismatch: The state does not fit this script; nothing was loaded.
        """
        try:
            got = pull_state(self._s, rep, deadline, self._replica.local_bytes(),
                             self._superseded)
            loaded = StateSpace.load(got.manifest, got.buffer)
        except ChaosError as exc:  # TransferFailed among them
            log.warning("replicating the state from %s failed: %s", sorted(rep.sources), exc)
            return False
        why = self._replica.fit_error(loaded)
        if why is not None:
            step = loaded.runtime.get("step")
            msg = f"{self.node_id} cannot join cluster state of step {step}: {why}"
            self._s.report(StateRefused(reason=msg))
            self._s.flush_reports()  # before the raise ends the script: chaosd must not restart it
            raise StateMismatch(msg)
        self._replica.restore(loaded)
        self._speeds, self._shard = None, None
        log.info("restored step %d (%d bytes) from %s in %.0f ms", self._replica.step,
                 got.report.bytes, ", ".join(got.report.sources), got.report.delay_ms)
        self._s.report(got.report)
        return True

    # -- rounds ----------------------------------------------------------------------------
