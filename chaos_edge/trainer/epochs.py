"""Opening an epoch: the agreement on the committed step, the divergence guard, reruns.

A mixin of :class:`~chaos_edge.trainer.api.Trainer`. Every epoch (a policy version and attempt)
opens with an agreement (``AllReducer.agree``) on the members' last committed round; after an
abort the Trainer waits (bounded) for a newer policy, else reruns in the next attempt.

The data plane counts *rounds*: in ``every-step`` mode a round is a step, so its step is
``trainer.step``; in ``diloco`` mode only the outer steps are rounds, and the data plane's step
is ``trainer.step // inner_steps`` (:meth:`_rstep`). With it the agreement's rule is the same
in both modes: members differ by at most one round, and one behind applies the result it holds
(a member that committed an outer step may have run inner steps past it meanwhile; it still
counts as one round ahead, not ``inner_steps`` steps).
"""

from __future__ import annotations

import logging
from typing import Any

from chaos_edge.dataplane import AllReducer, RoundAborted
from chaos_edge.dataplane.agree import Decision
from chaos_edge.trainer.control import StateDiverged, TrainerError
from chaos_edge.trainer.parts import TrainerParts
from chaos_edge.trainer.poller import POLL_S
from daemon.contracts import protocol
from daemon.contracts.policy import SyncPolicy

log = logging.getLogger("chaos.trainer")
RERUN_WAIT_S = 1.0  # after an abort, wait this long for a newer policy before retrying as is


class Epochs(TrainerParts):
    """Agreements, the guard and reruns (mixed into the Trainer)."""

    reducer: AllReducer
    timeout: float
    digest_every: int
    _agreed: tuple[int, int] | None
    _agreed_members: tuple[str, ...] | None
    _attempt: dict[int, int]
    _checked: int
    _diverged: bool

    def _apply(self, values: Any, version: int) -> None:
        raise NotImplementedError

    def _rstep(self) -> int:
        """The data plane's step: the last committed round (module docstring)."""
        return self._replica.round_step()

    def _epoch(self, pub: SyncPolicy) -> tuple[int, int]:
        return (pub.version, self._attempt.get(pub.version, 0))

    def _admits_newcomer(self, pub: SyncPolicy) -> bool:
        """Whether ``pub`` has a member who was not in our last agreement (a join, or a
        rejoin after a drop): its state is one the divergence guard has not compared."""
        return self._agreed_members is None or not set(pub.members) <= set(self._agreed_members)

    def _check_due(self) -> bool:
        """Whether this round's epoch compares digests: every ``digest_every`` steps (in
        ``diloco`` mode, every outer step at or past such a multiple)."""
        every, r, outer = self.digest_every, self._rstep(), self._replica.outer
        if every <= 0 or self._replica.step <= 0:
            return False
        if outer is not None:
            every = max(1, round(every / outer.inner_steps))
        return r % every == 0 and self._checked != r

    def _agree(self, pub: SyncPolicy, attempt: int, digest: bytes) -> bool:
        """Open the epoch; True if it committed the held result of the next round.

        The decision is the newest committed round among the members. A member at it goes on;
        one a round behind applies the result it holds. A member that cannot reach it (further
        behind, or one behind without the result) is stale: only it raises StateDiverged and
        is re-replicated; the others keep their state (they are at the agreed round), and
        their next round reruns once the scheduler has dropped the stale member.

        The members at the agreed round also compare digests of their whole state (the
        divergence guard); one outside the majority is reported and re-replicated.
        """
        r = self._rstep()
        dec = self.reducer.agree(policy=pub, committed=r, digest=digest,
                                 holds=self._replica.held is not None, attempt=attempt)  # fmt: skip
        self._agreed, self._agreed_members = (pub.version, attempt), pub.members
        if dec.step == r + 1 and self._replica.held is not None:
            self._apply(self._replica.held, self._replica.held_version)
            self._checked = self._rstep()  # compared without us this time; next time with us
            return True
        if dec.step == r:
            self._replica.held = None  # nobody alive applied it: everyone reruns the round
            self._checked = r
            if digest and dec.digest and dec.digest != digest:
                self._diverge(dec, digest)
            return False
        unit = "step" if self._replica.outer is None else "outer step"
        if dec.step > r:
            lacks = " and lacks the result of the next one" if dec.step == r + 1 else ""
            raise StateDiverged(f"{self.node_id} is at {unit} {r}{lacks} but the cluster "
                                f"agreed on {unit} {dec.step}; restart the worker to rejoin")
        raise StateDiverged(f"{self.node_id} is at {unit} {r}, ahead of the {unit} the "
                            f"cluster agreed on ({dec.step}); restart the worker to rejoin")

    def _diverge(self, dec: Decision, digest: bytes) -> None:
        """Our state is not the majority's: say so, train on with no samples (so our state
        pollutes nobody's) until the scheduler drops us, then rejoin with a fresh replica."""
        if self._diverged:
            return
        self._diverged = True
        log.error("%s: state of step %d differs from the cluster's (%s, majority %s); "
                  "re-replicating", self.node_id, self._replica.step, digest.hex()[:16],
                  dec.digest.hex()[:16])  # fmt: skip
        self._s.report(protocol.StateDiverged(step=self._replica.step, digest=digest.hex(),
                                     majority=dec.digest.hex(), variants=dec.digests))
        self._s.flush_reports()

    def _past_us(self, pub: SyncPolicy) -> SyncPolicy | None:
        """The policy of the round after ours, if it is newer than ``pub`` and a peer is
        already in its epoch: that peer committed our round (a new node under it restored
        the state of our round), so rerunning ours is pointless. Every-step mode only."""
        if self._replica.outer is not None:
            return None
        nxt = self._s.book.for_round(self._replica.step + 2)
        if (nxt is None or nxt.version <= pub.version or self.node_id not in nxt.members
                or self.reducer.newest_epoch()[0] < nxt.version):
            return None
        return nxt

    def _catch_up(self, pub: SyncPolicy, nxt: SyncPolicy) -> bool:
        """Open the epoch of the round after ours with the peers already in it, holding our
        round's result; True if that committed it. Else every member there held it without
        a commit: our round reruns under its own policy in a newer attempt."""
        try:
            if self._agree(nxt, self._epoch(nxt)[1], b""):
                self._version = pub.version
                return True
        except RoundAborted as exc:
            log.info("%s: catching up in epoch %s failed: %s", self.node_id,
                     self._epoch(nxt), exc.reason)  # fmt: skip
        own = self._attempt.get(pub.version, 0)
        self._attempt[pub.version] = max(own + 1, self.reducer.newest_attempt(pub.version))
        return False

    def _next_epoch(self, pub: SyncPolicy, deadline: float, exc: RoundAborted
                    ) -> SyncPolicy | None:  # fmt: skip
        """After an abort: wait (bounded) for a newer policy, else rerun with a newer attempt.

        Returns the policy of the round after ours when peers have already committed ours
        (:meth:`_past_us`) and we hold its result: the caller catches up in that epoch.

        Raises:
            StateDiverged: Peers committed our round and we lack its result.
        """
        self._s.redial()
        wait_until = min(deadline, self._clock.monotonic() + RERUN_WAIT_S)
        while self._s.book.for_round(self._replica.step + 1) is pub:
            nxt = self._past_us(pub)
            if nxt is not None:
                if self._replica.held is None:
                    raise StateDiverged(
                        f"{self.node_id} is at step {self._replica.step} and lacks the result "
                        f"of the next one, which peers committed before opening policy "
                        f"v{nxt.version}; restart the worker to rejoin")  # fmt: skip
                return nxt
            # First: past the deadline, every rerun would abort at once (a spin), not wait.
            if self._clock.monotonic() > deadline:
                raise TrainerError(f"step {self._replica.step + 1} could not complete within "
                                   f"{self.timeout:g}s; last abort: {exc.reason}")  # fmt: skip
            # A newer version on the wire means its policy is on its way to us too.
            now = self._clock.monotonic()
            if self.reducer.newest_epoch()[0] <= pub.version and now >= wait_until:
                # Join the newest attempt a neighbour started, else open the next one; taking
                # the larger of the two never leapfrogs, so the members converge.
                own = self._attempt.get(pub.version, 0)
                self._attempt[pub.version] = max(own + 1, self.reducer.newest_attempt(pub.version))
                return None
            self._s.wait(POLL_S)
            self._poll()
        return None
