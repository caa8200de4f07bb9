"""Scheduler election over MQTT, which has no compare-and-set.

Rules (all nodes apply the same ones, so they converge without talking more):

* A claim ``(term, id)`` beats another if its term is higher, or the terms tie and its id is
  lower. Every node remembers the best claim it has seen; ``term`` never goes down.
* A node stands only when the accepted leader is gone (its last will fired, or its heartbeats
  stopped) and it has been connected for ``grace_s`` (so a reconnecting node hears the retained
  claim first). Live nodes stand in id order, ``stagger_s`` apart, so usually exactly one does;
  if two do, the tie-break settles it.
* A leader that sees a better claim steps down at once, unless more nodes train under its own
  policies than the claim says train under the claimant's (two sides of a healed partition
  meet): then it restates its claim and contests for ``contest_s``, taking in the fresher
  claims that answer it, and if it still outnumbers the best of them it claims a term above
  it. The largest training part keeps its scheduler, as the partition rule wants, rather than
  whichever side elected last. A leader with nobody training under it (a stale one, thawed
  from SIGSTOP: its old followers' beats now name the new term's policies) has nothing to
  contest with. A tie keeps the better claim. The claimant's part is weighed by its claim or
  by what the leader hears itself of the nodes outside its own part, whichever says more (a
  claim lags), and the contest is won only on what was heard: every live peer heard lately,
  and none outside our part holding a newer state than ours. A stale scheduler must not win
  on what it has not heard yet (the simulator's seed 1127).
* A leader that sees a worse claim (a stale leader, say) re-asserts its own, repairing the
  retained topic; if the worse claim has the same term (the two sides of a cut each elected
  one), it claims the next term, so that a node never obeys two schedulers in one term.
* A follower whose leader is alive does not leave it for a better claim at once: it waits up to
  two contest windows (the leader may outbid the claim), and goes as soon as its leader dies.
* Commands carry the term: a node drops a command whose term is below the best it knows.
* The term outlives the process (the agent keeps it in the data dir and :meth:`restore` s it).
  A node that remembers a cluster (term > 0), or sees a live peer that does (its presence
  says which term it knew), but holds none of its state stands only after ``orphan_s`` of
  vacancy: a broker that restarted without persistence has lost every retained claim and
  snapshot, and the peers that still hold the state must get the first chance to lead, or this
  node would bootstrap a second cluster beside them (the simulator's seed 66: a new box did).
  A node that knows no cluster and sees nobody waits a reconnect backoff first: the broker may
  be one that has just lost its memory, and the members are reconnecting (seed 1201).
  A node whose worker or disk holds a training state, but not the view, stands after every
  live node's turn and two reconnect backoffs: after a power cut of every box and the broker
  only the disks hold the state, and each broker restart began the ``orphan_s`` wait again
  (96 s to resume in the soak's hour of stop 34); a node with the view, or a live scheduler
  reconnecting, still leads first.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace

from daemon.contracts.clock import Clock
from daemon.contracts.config import ElectionConfig


class Action(enum.Enum):
    NONE = "none"
    CLAIM = "claim"          # publish our claim (new term or re-assertion)
    STEP_DOWN = "step-down"  # we were leader and no longer are
    FOLLOW = "follow"        # a new leader was accepted


class Holding(enum.Enum):
    """What a scheduler elected on this node would start from."""
    VIEW = "view"        # the cluster's snapshot (the retained view): it governs at once
    STATE = "state"      # a training state alone (our worker's, or a snapshot on our disk)
    NOTHING = "nothing"  # neither: a holder of the state must get the first chance


@dataclass(frozen=True)
class Verdict:
    action: Action
    term: int
    leader: str | None


@dataclass(frozen=True)
class Rival:
    """A better claim held back: a leader contests it, a follower defers it."""

    term: int
    leader: str
    training: int  # nodes training under its policies, as its claim said (-1: not said)
    until: float  # monotonic time of the decision
    step: int = -1  # the newest step they committed, as its claim said (-1: not said)

    @property
    def claim(self) -> tuple[int, str]:
        return (self.term, self.leader)


@dataclass(frozen=True)
class Heard:
    """What a contesting scheduler hears itself of the nodes outside its part, by their
    heartbeats: a claim says what its sender had heard when it sent it, and that lags."""

    training: int = -1  # live nodes training following the rival
    step: int = -1  # the newest state a live node outside our part holds
    everyone: bool = True  # every live peer was heard lately (none holds a state unknown to us)


def stronger(own: int, own_step: int, training: int, step: int) -> bool:
    """Whether our part should keep the cluster over a rival's: the one holding the newer
    state first (the work kept; a stale scheduler back from a cut, or one whose trainees are
    stuck joining, holds an older one: the simulator's seeds 478 and 1260), then the one with
    more nodes training (fewer to re-replicate)."""
    if own_step >= 0 and step >= 0 and own_step != step:
        return own_step > step
    return own > max(training, 0)


def better(a: tuple[int, str], b: tuple[int, str]) -> bool:
    """Is claim ``a`` = (term, id) better than ``b``?"""
    return a[0] > b[0] or (a[0] == b[0] and a[1] < b[1])


class Election:
    """One node's view of who schedules, and when to stand."""

    def __init__(self, me: str, cfg: ElectionConfig, clock: Clock) -> None:
        self.me = me
        self._cfg = cfg
        self._clock = clock
        self.term = 0
        self.leader: str | None = None
        self.elected_at: float | None = None
        self._vacant_since: float | None = None
        self._connected_since: float | None = None
        self._my_term: int | None = None  # the last term this process itself claimed
        self._contest: Rival | None = None  # as leader: a better claim we may outnumber
        self._deferred: Rival | None = None  # as follower: a better claim, our leader alive
        self._challenged_until = -1.0  # a worse claim's contest may still be deciding
        self._live: set[str] = set()  # the live peers of the last tick
        self._obeyed: dict[int, str] = {}  # term -> the scheduler whose commands we acted on

    @property
    def contested(self) -> Rival | None:
        """The better claim we lead against, while we count."""
        return self._contest

    @property
    def challenged(self) -> bool:
        """A worse claim than ours was heard from another scheduler a moment ago: its sender
        may be contesting us (:meth:`on_claim`), deciding on the state we last said."""
        return self._clock.monotonic() < self._challenged_until

    @property
    def deferring(self) -> bool:
        """A follower holding on to its live leader against a better claim: it must not take
        the claimant's snapshot or policies meanwhile."""
        return self._deferred is not None

    def restore(self, term: int) -> None:
        """Start from the best term an earlier run of this node knew (never go back)."""
        self.term = max(self.term, term)

    @property
    def is_leader(self) -> bool:
        return self.leader == self.me

    def _verdict(self, action: Action) -> Verdict:
        return Verdict(action, self.term, self.leader)

    def connected(self) -> None:
        self._connected_since = self._clock.monotonic()
        self._vacant_since = None

    def disconnected(self) -> None:
        self._connected_since = None

    def on_claim(self, leader: str, term: int, training: int = -1, own: int = 0,
                 step: int = -1, own_step: int = -1, heard: Heard = Heard()) -> Verdict:
        """Apply a claim heard on ``sched/leader``.

        Args:
            training: The nodes training under the claimant's policies, as its claim says.
            own: The nodes training under ours, if we lead (as we hear their heartbeats).
            step: The newest step the claimant's trainees committed, as its claim says.
            own_step: Ours, likewise.
            heard: What we hear ourselves of the nodes outside our part, if we lead: the
                claimant's part is weighed by its claim or by this, whichever says more.
        """
        if leader == self.me and term != self._my_term:
            # A claim in our name that this process never made: an earlier run of this node
            # left it retained, and peers may still follow it. Leave the seat vacant in our
            # view so that we stand afresh with a higher term (or repair it if we lead).
            if self.is_leader and term < self.term:
                return self._verdict(Action.CLAIM)
            if term > self.term or self.leader in (None, self.me):
                was_leader = self.is_leader
                self.term, self.leader = max(self.term, term), None
                return self._verdict(Action.STEP_DOWN if was_leader else Action.NONE)
            return self._verdict(Action.NONE)
        if self.leader is None and term >= self.term:
            was = self.leader
            self.term, self.leader = term, leader
            self._deferred = None
            return self._verdict(Action.NONE if was == leader else Action.FOLLOW)
        current = (self.term, self.leader or "")
        if (term, leader) == current:
            return self._verdict(Action.NONE)
        if better((term, leader), current):
            now = self._clock.monotonic()
            training, step = max(training, heard.training), max(step, heard.step)
            if (self.is_leader and stronger(own, own_step, training, step)
                    and self._cfg.contest_s > 0):
                opened = self._contest is None
                self._contest = self._hold(self._contest, term, leader, training, step,
                                           now + self._cfg.contest_s)  # fmt: skip
                # Opening, we restate our claim with our count: the rival answers a worse
                # claim with its own, freshly counted (the one we heard may be retained, from
                # before its part grew; a healed bridge drops repeats of old ones as replays).
                return self._verdict(Action.CLAIM if opened else Action.NONE)
            if (not self.is_leader and self.leader in self._live and leader != self.leader
                    and self._cfg.contest_s > 0):
                self._deferred = self._hold(self._deferred, term, leader, training, step,
                                            now + 2 * self._cfg.contest_s)  # fmt: skip
                return self._verdict(Action.NONE)
            return self._adopt(term, leader)
        # A worse claim: only the leader answers, by re-asserting its own; above it, when the
        # two tie on the term (both sides of a cut elected one), so that no node that obeyed
        # the other in this term obeys us in the same one (the simulator's seed 616).
        if leader not in (self.me, self.leader) and self._cfg.contest_s > 0:
            # Its sender (back from a cut) may contest us on the step we last claimed: a round
            # our side commits meanwhile is one it cannot count, and if it wins, a fork (the
            # simulator's seed 16629: it won on a stale tie and redid our newest rounds).
            self._challenged_until = self._clock.monotonic() + 2 * self._cfg.contest_s
        if self.is_leader and term == self.term:
            self.term += 1
            self._my_term, self.elected_at = self.term, self._clock.monotonic()
        return self._verdict(Action.CLAIM if self.is_leader else Action.NONE)

    @staticmethod
    def _hold(held: Rival | None, term: int, leader: str, training: int, step: int,
              until: float) -> Rival:  # fmt: skip
        """The best claim held back so far; a repeat of it brings a fresher count, and the
        decision stays at the time the first one set."""
        if held is None or better((term, leader), held.claim):
            return Rival(term, leader, training, held.until if held else until, step)
        if (term, leader) == held.claim:
            return replace(held, training=training, step=step)
        return held

    def _adopt(self, term: int, leader: str) -> Verdict:
        """Accept a better claim: step down if we led, else follow."""
        was_leader = self.is_leader
        self.term, self.leader = term, leader
        self._vacant_since = None
        self._contest = None
        if self._deferred is not None and not better(self._deferred.claim, (term, leader)):
            self._deferred = None
        return self._verdict(Action.STEP_DOWN if was_leader else Action.FOLLOW)

    def _settle_rivals(self, now: float, own: int, own_step: int = -1,
                       heard: Heard = Heard()) -> Verdict | None:
        """Decide a contest or a deferral whose time has come.

        A contest is won on what we heard, never on what we did not: only if every live peer
        was heard lately, and our part holds a newer state than the rival's part as its claim
        or our own hearing says (or as new a state, and more nodes). A node we have not heard
        since we came back may hold a newer state than ours, and our policy of the higher
        term, effective at once, would have our part rebuild the rounds it built (the
        simulator's seed 1127: a scheduler back from a cut and a broker restart outbid the
        newer term on its own worker's stale step before it heard anyone)."""
        c = self._contest
        if c is not None and now >= c.until:
            self._contest = None
            training, step = max(c.training, heard.training), max(c.step, heard.step)
            if self.is_leader and heard.everyone and stronger(own, own_step, training, step):
                # Still the larger part: outbid the claim, so everyone takes ours.
                self.term = max(self.term, c.term) + 1
                self._my_term, self.elected_at = self.term, now
                return self._verdict(Action.CLAIM)
            if better(c.claim, (self.term, self.leader or "")):
                return self._adopt(c.term, c.leader)
        d = self._deferred
        if d is not None and (now >= d.until or self.leader not in self._live):
            self._deferred = None
            if better(d.claim, (self.term, self.leader or "")):
                return self._adopt(d.term, d.leader)
        return None

    def leader_lost(self) -> None:
        """The accepted leader died (last will or detector): the seat is vacant."""
        if not self.is_leader:
            self.leader = None

    def tick(self, live: set[str], holding: Holding = Holding.VIEW, own: int = 0,
             cluster_term: int = 0, alone_s: float = 0.0, own_step: int = -1,
             heard: Heard = Heard()) -> Verdict:
        """Decide whether to stand, given the nodes we currently believe alive.

        Args:
            live: ids of live nodes as this node sees them (``me`` is implied).
            holding: what a scheduler elected here would start from. A node with the view
                stands in its rank; one with a training state alone after every live node
                had its turn and ``2 * alone_s``, since a peer may hold the view or lead and
                be reconnecting (a scheduler without the view knows no node); one with
                neither after ``orphan_s``.
            own: the nodes training under our policies, if we lead (a contest's count).
            cluster_term: the best term a live peer says it knows (its presence).
            alone_s: how long a node that knows no cluster and sees no peer waits before it
                starts one: a broker that restarted without persistence looks empty until
                the members reconnect (their backoff), and they hold the state.
            own_step: the newest step a node of our part holds, if we lead.
            heard: what we hear ourselves of the nodes outside our part, if we lead and a
                contest runs (:meth:`_settle_rivals`).
        """
        now = self._clock.monotonic()
        self._live = set(live)
        settled = self._settle_rivals(now, own, own_step, heard)
        if settled is not None:
            return settled
        if self._connected_since is None or now - self._connected_since < self._cfg.grace_s:
            return self._verdict(Action.NONE)
        if self.leader is not None and (self.leader in live or self.is_leader):
            self._vacant_since = None
            return self._verdict(Action.NONE)
        if self._vacant_since is None:
            self._vacant_since = now
        rank = sorted(live | {self.me}).index(self.me)
        wait = rank * self._cfg.stagger_s
        knows_cluster = max(self.term, cluster_term) > 0
        if knows_cluster and holding is Holding.NOTHING:
            wait = max(wait, self._cfg.orphan_s)  # let a peer that holds the state lead
        elif knows_cluster and holding is Holding.STATE:
            # The view's turn first, and two backoffs for every peer to reconnect after a
            # broker restart: a live scheduler re-asserts its claim then. Seeing nobody yet,
            # a rebooted node stood 0.6 s after it connected and started the cluster over
            # from its disk's older state beside the scheduler still reconnecting (the hour
            # of stop 35: steps 14851-14857 committed twice).
            wait = max((len(live | {self.me}) + rank) * self._cfg.stagger_s, 2 * alone_s)
        elif not live and holding is Holding.NOTHING:
            wait = max(wait, alone_s)  # an empty broker may be one that lost its memory
        if now - self._vacant_since < wait:
            return self._verdict(Action.NONE)
        self.term += 1
        self.leader = self.me
        self._my_term = self.term
        self.elected_at = now
        self._vacant_since = None
        return self._verdict(Action.CLAIM)

    def admits(self, term: int, leader: str) -> bool:
        """Fencing: may a command stamped ``(term, leader)`` act on this node?

        Never two schedulers' in one term: after a tie (both sides of a cut elected a
        scheduler of the same term) the winner leads the next term (``on_claim``), and until
        then a node that obeyed the loser in this term obeys nobody else in it."""
        if term < self.term:
            return False
        if self._obeyed.get(term, leader) != leader:
            return False
        return not (term == self.term and self.leader is not None and leader != self.leader)

    def obeyed(self, term: int, leader: str) -> None:
        """Record that this node acted on a command of ``leader`` in ``term``."""
        self._obeyed[term] = leader
        for old in [t for t in self._obeyed if t < term - 2]:
            del self._obeyed[old]
