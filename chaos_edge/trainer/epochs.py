"""Opening an epoch: the agreement on the committed step, the divergence guard, reruns.

Every epoch (a policy version and attempt) opens with an agreement (``AllReducer.agree``) on
the members' last committed round; after an abort the Trainer waits (bounded) for a newer
policy, else reruns in the next attempt. :class:`Epochs` keeps what that needs across rounds:
the last epoch agreed and its members, the attempt of each policy version, the last round the
guard compared, and whether the guard found this member out of line.

The data plane counts *rounds*: in ``every-step`` mode a round is a step; in ``diloco`` mode
only the outer steps are rounds, one every ``period`` steps (``inner_steps``, or ``inner_steps
/ fragments`` in ``streaming`` mode), numbered on across switches of the mode
(:class:`~chaos_edge.trainer.rhythm.Rhythm`, :meth:`Replica.round_step`). With it the
agreement's rule
is the same in both modes: members differ by at most one round, and one behind applies the
result it holds (a member that committed an outer step may have run inner steps past it
meanwhile; it still counts as one round ahead, not ``inner_steps`` steps).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from chaos_edge.dataplane import AllReducer, RoundAborted
from chaos_edge.dataplane.agree import Decision
from chaos_edge.trainer.control import StateDiverged
from chaos_edge.trainer.poller import POLL_S
from chaos_edge.trainer.replica import Replica
from chaos_edge.trainer.session import Session
from chaos_edge.trainer.timing import StepAlarm
from daemon.contracts import protocol
from daemon.contracts.clock import Clock
from daemon.contracts.policy import SyncMode, SyncPolicy

log = logging.getLogger("chaos.trainer")
RERUN_WAIT_S = 1.0  # after an abort, wait this long for a newer policy before retrying as is
Epoch = tuple[int, int]  # (policy version, attempt)


def admits_newcomer(pub: SyncPolicy, agreed_members: tuple[str, ...] | None) -> bool:
    """Whether ``pub`` has a member who was not in our last agreement (a join, or a rejoin
    after a drop): its state is one the divergence guard has not compared."""
    return agreed_members is None or not set(pub.members) <= set(agreed_members)


class Epochs:
    """This member's epochs: agreements, the guard's comparisons and reruns.

    Args:
        me: This node's id.
        reducer: The data plane's all-reduce (its agreements and attempts).
        session: The worker's session (the policy book, reports, links to redial).
        replica: The state the agreements are about.
        clock: The time source of the rerun waits.
        digest_every: Steps between the guard's comparisons (0: joins only).
        poll: Callback: take in what the poller fetched (the Trainer's ``_poll``).
        commit: Callback: apply a committed result of round ``step + 1``, with the policy
            version and sync mode it ran under (the Trainer's ``_apply``).
    """

    def __init__(self, me: str, reducer: AllReducer, session: Session, replica: Replica,
                 clock: Clock, *, digest_every: int, poll: Callable[[], None],
                 commit: Callable[[Any, int, SyncMode | None], None]) -> None:  # fmt: skip
        self.me, self.reducer, self._s, self._replica = me, reducer, session, replica
        self._clock, self.digest_every = clock, digest_every
        self._poll, self._commit = poll, commit
        self.agreed: Epoch | None = None  # the last epoch whose agreement we took part in
        self.agreed_members: tuple[str, ...] | None = None  # the members of that epoch
        self.diverged = False  # the guard found us out of line: no samples until rejoined
        self._attempt: dict[int, int] = {}  # policy version -> its current attempt
        self._checked = -1  # the last round whose digest the members compared
        # (our step, policy): we opened this newer policy's epoch to catch up at that step.
        # The data plane runs no phase older than the last, so until we commit, our rounds
        # run under it (or a newer one), never again under the older policy of our round.
        self._ahead: tuple[int, SyncPolicy] | None = None

    def joined(self) -> None:
        """A join made us a member: our next round opens an epoch that compares our state,
        and the guard holds nothing against us any more."""
        self.agreed, self.agreed_members, self.diverged = None, None, False
        self._ahead = None

    def governing(self, pub: SyncPolicy) -> SyncPolicy:
        """The policy our next round runs under: ``pub`` (the book's for that round), unless
        we already opened a newer policy's epoch at this step to catch up in it."""
        if self._ahead is None or self._ahead[0] != self._replica.step:
            return pub
        ahead = self._ahead[1]
        return ahead if ahead.version > pub.version else pub

    def epoch(self, pub: SyncPolicy) -> Epoch:
        """The epoch our next round under ``pub`` runs in."""
        return (pub.version, self._attempt.get(pub.version, 0))

    def guard_turn(self, pub: SyncPolicy) -> None:
        """When the guard's comparison is due inside the epoch we agreed, open a fresh one:
        it opens with an agreement that compares digests. Every member is at this step in
        this epoch, so all bump alike."""
        if self.check_due() and self.epoch(pub) == self.agreed:
            self._bump(pub.version)

    def compares(self, pub: SyncPolicy) -> bool:
        """Whether the agreement that opens our next epoch compares digests. Only a member who
        was not in the last agreement brings a state that no guard has compared yet; a link
        change or a scale-in opens an epoch of members who agreed before and committed the
        same rounds since."""
        return self.epoch(pub) != self.agreed and (
            admits_newcomer(pub, self.agreed_members) or self.check_due())

    def check_due(self) -> bool:
        """Whether this round's epoch compares digests: every ``digest_every`` steps (in
        ``diloco`` mode, every outer step at or past such a multiple)."""
        every, r = self.digest_every, self._replica.round_step()
        if every <= 0 or self._replica.step <= 0:
            return False
        every = max(1, round(every / self._replica.rhythm.period))
        return r % every == 0 and self._checked != r

    def agree(self, pub: SyncPolicy, attempt: int, digest: bytes) -> bool:
        """Open the epoch; True if it committed the held result of the next round.

        The decision is the newest committed round among the members. A member at it goes on;
        one a round behind applies the result it holds (as all do when every member is a round
        behind and holds it: ``agree.decide``). A member that cannot reach it (further
        behind, or one behind without the result) is stale: only it raises StateDiverged and
        is re-replicated; the others keep their state (they are at the agreed round), and
        their next round reruns once the scheduler has dropped the stale member.

        The members at the agreed round also compare digests of their whole state (the
        divergence guard); one outside the majority is reported and re-replicated.
        """
        r, rep = self._replica.round_step(), self._replica
        dec = self.reducer.agree(policy=pub, committed=r, digest=digest,
                                 holds=rep.held is not None, attempt=attempt)  # fmt: skip
        self.agreed, self.agreed_members = (pub.version, attempt), pub.members
        if dec.step == r + 1 and rep.held is not None:
            self._commit(rep.held, rep.held_version, rep.held_mode)
            self._checked = rep.round_step()  # compared without us this time; next time with us
            return True
        if dec.step == r:
            rep.held = None  # some member lacks it, so nobody applied it: everyone reruns
            self._checked = r
            if digest and dec.digest and dec.digest != digest:
                self._diverge(dec, digest)
            return False
        unit = "step" if rep.outer is None else "outer step"
        if dec.step > r:
            lacks = " and lacks the result of the next one" if dec.step == r + 1 else ""
            raise StateDiverged(f"{self.me} is at {unit} {r}{lacks} but the cluster "
                                f"agreed on {unit} {dec.step}; restart the worker to rejoin")
        raise StateDiverged(f"{self.me} is at {unit} {r}, ahead of the {unit} the "
                            f"cluster agreed on ({dec.step}); restart the worker to rejoin")

    def _diverge(self, dec: Decision, digest: bytes) -> None:
        """Our state is not the majority's: say so, train on with no samples (so our state
        pollutes nobody's) until the scheduler drops us, then rejoin with a fresh replica."""
        if self.diverged:
            return
        self.diverged = True
        step = self._replica.step
        log.error("%s: state of step %d differs from the cluster's (%s, majority %s); "
                  "re-replicating", self.me, step, digest.hex()[:16],
                  dec.digest.hex()[:16])  # fmt: skip
        self._s.report(protocol.StateDiverged(step=step, digest=digest.hex(),
                                              majority=dec.digest.hex(), variants=dec.digests))
        self._s.flush_reports()

    def _past_us(self, pub: SyncPolicy) -> SyncPolicy | None:
        """The policy of the round after ours, if it is newer than ``pub`` and a peer is
        already in its epoch: that peer committed our round (a new node under it restored
        the state of our round), so rerunning ours is pointless. Every-step mode only."""
        if self._replica.outer is not None:
            return None
        nxt = self._s.book.for_round(self._replica.step + 2)
        if (nxt is None or nxt.version <= pub.version or self.me not in nxt.members
                or self.reducer.newest_epoch()[0] < nxt.version):
            return None
        return nxt

    def catch_up(self, nxt: SyncPolicy) -> bool:
        """Open the epoch of the round after ours with the peers already in it, holding our
        round's result; True if that committed it.

        From here on our round runs under ``nxt`` (:meth:`governing`): this node has run a
        phase of ``nxt``, and the data plane runs none older after it. If the agreement
        aborted, the next try is a newer attempt of ``nxt``. If it decided our own step (the
        members there are all a round behind and one lacks the result, so none committed
        it), the round reruns in that same epoch, as every member of it does.
        """
        self._ahead = (self._replica.step, nxt)
        try:
            return self.agree(nxt, self.epoch(nxt)[1], b"")
        except RoundAborted as exc:
            log.warning("%s: catching up in epoch %s failed: %s", self.me, self.epoch(nxt),
                        exc.reason)  # fmt: skip
            self._bump(nxt.version)
            return False

    def next_epoch(self, pub: SyncPolicy, alarm: StepAlarm, exc: RoundAborted
                   ) -> SyncPolicy | None:  # fmt: skip
        """After an abort: wait (bounded) for a newer policy, else rerun with a newer attempt;
        ``alarm`` rings at each step timeout meanwhile.

        Returns the policy of the round after ours when peers have already committed ours
        (:meth:`_past_us`) and we hold its result: the caller catches up in that epoch.

        Raises:
            StateDiverged: Peers committed our round and we lack its result.
        """
        self._s.redial()
        alarm.check(self._replica.step + 1, f"last abort: {exc.reason}")
        wait_until = self._clock.monotonic() + RERUN_WAIT_S
        while self._next_round_policy() is pub:
            nxt = self._past_us(pub)
            if nxt is not None:
                if self._replica.held is None:
                    raise StateDiverged(
                        f"{self.me} is at step {self._replica.step} and lacks the result "
                        f"of the next one, which peers committed before opening policy "
                        f"v{nxt.version}; restart the worker to rejoin")  # fmt: skip
                return nxt
            alarm.check(self._replica.step + 1, f"last abort: {exc.reason}")
            # A newer version on the wire means its policy is on its way to us too.
            now = self._clock.monotonic()
            if self.reducer.newest_epoch()[0] <= pub.version and now >= wait_until:
                self._bump(pub.version)
                return None
            self._s.wait(POLL_S)
            self._poll()
        return None

    def _next_round_policy(self) -> SyncPolicy | None:
        pub = self._s.book.for_round(self._replica.step + 1)
        return None if pub is None else self.governing(pub)

    def _bump(self, version: int) -> None:
        """Move ``version`` on to its next attempt: the newest one a neighbour started, else
        the one after ours. Taking the larger of the two never leapfrogs, so the members
        converge."""
        own = self._attempt.get(version, 0)
        self._attempt[version] = max(own + 1, self.reducer.newest_attempt(version))
