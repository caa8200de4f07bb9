"""The node agent's part in the election: claims, contests, and the scheduler it follows.

:class:`Leadership` is an object the :class:`~daemon.agent.node.NodeAgent` owns (the rules are
:mod:`daemon.cluster.election`'s; this is what the agent does with their verdicts): it
publishes our claim with the count of nodes training under us, answers the claims it hears,
takes in the snapshot of the scheduler it follows (and holds back a rival's while it defers
that rival's claim), and, when the scheduler changes, asks the new one again for a join the
old one never finished. What it needs of the agent is :class:`LeadershipHost`: the agent's
state it reads, the two fields it sets (``role`` on stepping down, ``view`` on a snapshot),
and four callbacks.
"""

from __future__ import annotations

import logging
from collections import Counter
from typing import Any, Protocol

from daemon.agent.metrics import AgentMetrics
from daemon.agent.worker import WorkerSession
from daemon.cluster.detector import PhiAccrualDetector
from daemon.cluster.election import Action, Election, Heard, Verdict, better
from daemon.cluster.role import SchedulerRole
from daemon.contracts.clock import Clock
from daemon.contracts.messages import ClusterState, Event, Heartbeat, LeaderClaim, Topics, encode
from daemon.contracts.policy import POLICY_KEEP
from daemon.contracts.protocol import JoinRequest, RequestBody

log = logging.getLogger("chaosd.node")
TRAINING_FRESH_S = 2.0  # a contest counts followers heard this recently (four heartbeats)
EVENTS_KEEP = 1000


class LeadershipHost(Protocol):
    """What :class:`Leadership` needs of the node agent that owns it."""

    me: str
    clock: Clock
    topics: Topics
    election: Election
    role: SchedulerRole | None  # set to None when we step down
    worker: WorkerSession
    detector: PhiAccrualDetector
    metrics: AgentMetrics
    view: ClusterState | None  # set when we take in our scheduler's snapshot
    paused_since_view: bool  # cleared when the scheduler we follow speaks
    beats: dict[str, Heartbeat]
    last_heard: dict[str, float]
    events: dict[tuple[int, float], Event]
    policies: dict[int, dict[str, Any]]
    counters: Counter[str]

    def queue(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        """Publish (on the next flush)."""

    def live_peers(self) -> set[str]:
        """The peers the failure detector holds alive."""

    def request(self, body: RequestBody, reply: bool = False) -> str:
        """Send a request to whoever schedules."""

    def watch_leader(self) -> None:
        """Follow the heartbeats of the scheduler we now follow."""


class Leadership:
    """Election duties of the node agent: its claims, and what it does with a verdict."""

    def __init__(self, host: LeadershipHost) -> None:
        self._a = host
        # A rival's, while we defer its claim (or, as scheduler, a better claim's).
        self._held_state: ClusterState | None = None

    def queue_claim(self) -> None:
        count, step = self.training()
        claim = LeaderClaim(id=self._a.me, term=self._a.election.term, ts=self._a.clock.wall(),
                            training=count, step=step)
        self._a.queue(self._a.topics.leader, encode(claim), retain=True)

    def training_count(self, live: set[str] | None = None) -> int:
        """As scheduler: the live nodes (us included) whose worker last committed a round
        under one of our policies, by their heartbeats (a contested claim's count). 0 as a
        follower. ``live``: the live peers, if the caller has them already."""
        return self.training(live)[0]

    def training(self, live: set[str] | None = None) -> tuple[int, int]:
        """As scheduler: how many live nodes (us included) train following us, by heartbeats
        heard in the last TRAINING_FRESH_S, and the newest step a worker following us holds
        (joining or training; (0, -1) as a follower).

        Who follows whom, not whose policy numbers a node last trained under: the two sides
        of a cut both inherit the policies from before it, and a scheduler just elected
        counted the other side's trainees as its own (the simulator's seed 1260). Fresh
        heartbeats only: a scheduler thawed after a long freeze counted the beats it had from
        before it, and the step held, not only trained: the side holding the newest state may
        be rejoining at that moment (seed 2400)."""
        if self._a.role is None:
            return 0, -1
        beats = [hb for hb in self._fresh(live) if self._ours(hb)]
        count = sum(1 for hb in beats if hb.state == "active")
        steps = [hb.step for hb in beats]
        if self._a.worker.attached:
            count += self._a.worker.state == "active"
            steps.append(self._a.worker.step)
        return count, max(steps, default=-1)

    def rival(self, leader: str, live: set[str] | None = None) -> Heard:
        """As scheduler: what we hear ourselves of the nodes outside our part, by heartbeats
        heard in the last TRAINING_FRESH_S: how many train following ``leader`` (a better
        claim's sender), the newest state one of them holds, whoever it follows, and whether
        every live peer was heard (nothing, as a follower). A claim says what its sender had
        heard when it sent it, and that lags: the simulator's seed 1127 (Election.on_claim,
        Election._settle_rivals)."""
        if self._a.role is None:
            return Heard(everyone=False)
        live = self._a.live_peers() if live is None else live
        beats = self._fresh(live)
        outside = [hb for hb in beats if not self._ours(hb)]
        return Heard(training=sum(1 for hb in outside
                                  if hb.leader == leader and hb.state == "active"),
                     step=max((self.holds(hb) for hb in outside), default=-1),
                     everyone=len(beats) == len(live))

    @staticmethod
    def holds(hb: Heartbeat) -> int:
        """The newest state ``hb``'s node holds: its worker's, or a snapshot on its disk that
        its worker restores when it starts. A box back from a power cut holds its state on disk
        a moment before its worker runs: counted as holding nothing, a scheduler thawed from a
        cut outbid the rebooted side's term with its own older state, and trained on alone
        from it (the simulator's seed 9013: round 335 built again beside the 380 on n3's
        disk)."""
        return max(hb.holds, hb.snapshot)

    def _fresh(self, live: set[str] | None) -> list[Heartbeat]:
        """The last heartbeat of each live peer, heard within TRAINING_FRESH_S."""
        live = self._a.live_peers() if live is None else live
        now = self._a.clock.monotonic()
        return [hb for node in live if (hb := self._a.beats.get(node)) is not None
                and now - self._a.last_heard.get(node, -1e9) <= TRAINING_FRESH_S]

    def _ours(self, hb: Heartbeat) -> bool:
        """Whether the node of ``hb`` trains (or joins) following us."""
        return hb.leader == self._a.me and hb.state != "standby"

    def on_claim(self, claim: LeaderClaim) -> None:
        before = self._a.election.leader
        own, own_step = self.training()
        verdict = self._a.election.on_claim(claim.id, claim.term, training=claim.training,
                                            own=own, step=claim.step, own_step=own_step,
                                            heard=self.rival(claim.id))
        if verdict.action in (Action.FOLLOW, Action.STEP_DOWN) and verdict.leader != self._a.me:
            # A better claim is its sender's sign of life: a silence we heard while it was not
            # our leader (the other side of a healed partition) must not judge it dead at once.
            self._a.detector.forget(claim.id)
        self._a.watch_leader()
        if verdict.action is Action.CLAIM and self._a.role is not None \
                and self._a.election.term != self._a.role.term:
            # A tie on the term, won: lead the next one (Election.on_claim).
            self._a.role.outbid(self._a.election.term, claim.id, own, -1)
        if verdict.action is Action.CLAIM:
            self.queue_claim()
        elif verdict.action is Action.STEP_DOWN:
            log.warning("stepping down: %s holds term %d", claim.id, claim.term)
            self._a.role = None
        if verdict.action in (Action.FOLLOW, Action.STEP_DOWN):
            log.info("scheduler is %s (term %d)", verdict.leader, verdict.term)
            self._take_held_state()
        self.ask_new_leader(before)

    def _take_held_state(self) -> None:
        """Now following a new scheduler: take in its snapshot if we held it back."""
        held, self._held_state = self._held_state, None
        if held is not None and (held.term, held.leader) == (self._a.election.term,
                                                             self._a.election.leader):
            self.on_state(held)

    def ask_new_leader(self, before: str | None) -> None:
        """A join request went to the scheduler of a term that has ended (its partition
        healed, or it died): the new one never heard it, and the worker would wait out its
        join timeout. Ask again (a request already in flight there is a no-op)."""
        w, leader = self._a.worker, self._a.election.leader
        if leader is None or leader == before or not w.attached or w.state != "joining":
            return
        log.info("asking the new scheduler %s to let our worker join", leader)
        w.asked_at = self._a.clock.monotonic()
        self._a.request(JoinRequest(addr=w.data_addr, neighbors=w.neighbors, step=w.step))

    def settled(self, verdict: Verdict, before: str | None, term: int) -> None:
        """A contest or a deferral ended (Election.tick) with a STEP_DOWN or a FOLLOW."""
        if verdict.action not in (Action.STEP_DOWN, Action.FOLLOW):
            return
        if verdict.action is Action.STEP_DOWN:
            log.warning("stepping down: %s holds term %d (we held %d)", verdict.leader,
                        verdict.term, term)
            self._a.role = None
        self._a.detector.forget(verdict.leader or "")
        self._a.watch_leader()
        log.info("scheduler is %s (term %d)", verdict.leader, verdict.term)
        self._take_held_state()
        self.ask_new_leader(before)

    def on_state(self, st: ClusterState) -> None:
        claim = (st.term, st.leader)
        accepted = (self._a.election.term, self._a.election.leader or "")
        if self._a.role is not None:
            if claim != (self._a.role.term, self._a.me):
                # Someone else's snapshot overwrote the retained topic: repair it. A better
                # claim's is kept: if we step down to it, its view is the one to follow, not
                # ours. A scheduler back from a cut dropped the newer term's snapshot, stepped
                # down, was elected again when that term's scheduler left, and governed from
                # its own view of the term before, in which the members the newer term had
                # trained on (742) were no holders; its own part won the tie and trained on
                # from 736 (the simulator's seed 9200).
                if better(claim, (self._a.role.term, self._a.me)):
                    self._held_state = st
                self._a.role.sched.dirty = True
            return
        if self.stale(claim):
            self._a.counters["stale_states"] += 1
            return
        if self._a.election.deferring and claim != accepted:
            # Our live leader may yet outbid this one: train on under its policies. Kept, in
            # case we follow its scheduler after all (it republishes only on a change).
            self._held_state = st
            return
        self._a.paused_since_view = False  # the scheduler we follow says where things are
        if self._a.view is not None and (self._a.view.term, self._a.view.leader) == claim \
                and st.version <= self._a.view.version:
            return
        self._a.view = st
        self.merge_events(st.events)
        self.merge_policies(st)

    def stale(self, claim: tuple[int, str]) -> bool:
        """Is a snapshot of ``claim`` (term, leader) from a stale or losing scheduler? One of
        an older term than ours is, even while we know no leader (a reboot restores our term,
        not who leads): a scheduler frozen through a newer term's whole life thawed and
        published its old view, retained over the newer one, and a node rebooted after a power
        cut was elected on it; that view left the thawed node, 39 steps behind, the only
        member (the simulator's seed 7489: round 102 built again beside the 140 the others
        restored). With no leader known, a claim of our own term is not judged: any would
        beat the empty one."""
        election = self._a.election
        if election.leader is None:
            return claim[0] < election.term
        return better((election.term, election.leader), claim)

    def merge_policies(self, st: ClusterState) -> None:
        for pol in [*st.policies, st.policy]:
            version = pol.get("version") if isinstance(pol, dict) else None
            if isinstance(version, int):
                self._a.policies.setdefault(version, pol)
        for version in sorted(self._a.policies)[:-POLICY_KEEP]:
            del self._a.policies[version]

    def merge_events(self, events: list[Event]) -> None:
        new = [ev for ev in events if (ev.seq, ev.ts) not in self._a.events]
        for ev in events:
            self._a.events.setdefault((ev.seq, ev.ts), ev)
        self._a.metrics.new_events(new)
        if len(self._a.events) > EVENTS_KEEP:
            for key in sorted(self._a.events)[: len(self._a.events) - EVENTS_KEEP]:
                del self._a.events[key]
