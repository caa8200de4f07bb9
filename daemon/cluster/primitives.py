"""The four primitives, negotiated by the scheduler (paper IV-B, docs/training-protocol.md).

:class:`Negotiator` turns requests (join, leave, link add/del, link failure) and failures
into three things: commands for particular workers (``connect``, ``disconnect``,
``replicate``), a new sync policy in the retained snapshot, and an event with its measured
delays. It only changes :class:`~daemon.cluster.scheduler.Scheduler` state and queues commands; the
node agent sends them. Nothing here does I/O, so it is tested with a fake clock.
"""

from __future__ import annotations

import enum
import logging
import math
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import TypeGuard

from typing_extensions import assert_never

from daemon.cluster.keepers import Box, Keepers
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import Clock
from daemon.contracts.errors import PolicyError
from daemon.contracts.kinds import MEMBER_STATES, EventKind
from daemon.contracts.messages import Event, LinkRecord
from daemon.contracts.policy import (
    CHUNK_KIB_MAX,
    EVERY_STEP,
    SyncMode,
    SyncPolicy,
    chunk_for_rate,
    spanning_tree,
)
from daemon.contracts.protocol import (
    Bootstrap,
    ClusterRequest,
    CommandBody,
    Connect,
    Disconnect,
    JoinRequest,
    LeaveRequest,
    LinkEstimate,
    LinkFailed,
    LinkMetrics,
    LinkRecovered,
    LinkRequest,
    Replicate,
    Replicated,
    Report,
    RoundAborted,
    RoundStuck,
    ServeDeclined,
    SnapshotFailed,
    Stall,
    StateDiverged,
    StateRefused,
    Strategy,
    WorkerExit,
    valid_addr,
)

log = logging.getLogger("chaosd.primitives")
AUTO_NEIGHBORS = 2     # neighbours a joining node gets when it names none
# A measured tree this many times wider at its slowest link replaces the policy's tree; below
# that, a new tree would buy little and cost a planned change (and noise could flip it back).
RETREE_GAIN = 1.25
# A measured tree whose chunk size should be this many times larger or smaller than the
# policy's gets it (a fast link first read low, from a probe too short to measure it, gave
# loopback 128 KiB chunks for the whole run); within it, a new size buys little.
RECHUNK_GAIN = 4
STEP_MARGIN = 2        # at least this many steps of slack before a planned change
POLICY_LEAD_S = 0.5    # and at least this much time: the policy must reach every worker first
RATE_WINDOW_S = 5.0    # the training's step rate is measured over this window
# When no member is left, a joiner without the cluster's newest state waits this long for a
# holder of it to come back (a cut site, a box that reboots) before the cluster starts over
# from the best state that did come, and says so (a state-lost event).
HOLD_S = 60.0
# The last member's leave waits this long for a node outside (its worker attached) to ask to
# join and take the state, before it goes ahead with nobody to hand it to.
HAND_OVER_S = 5.0
# Links to one member that fail from two peers within this long, while neither peer's own
# links fail to others, say that member's worker broke, not the links (see _blame).
BLAME_S = 10.0
# A joiner ahead of members this scheduler has not heard yet waits at most this long for
# their heartbeats before it is judged on what the snapshot said of them.
UNHEARD_WAIT_S = 2.0
# A joiner that would start the cluster over from its own state waits at most this long for
# members that went silent (cut off, frozen) to be heard again: one reconnect backoff
# (mqtt.reconnect_max_s's default), by which boxes of a site that comes back have all
# reconnected. A longer wait would hold every restart after the last member truly died.
SILENT_WAIT_S = 5.0
KEEP_EVERY_S = 1.0  # the copies of the snapshots are looked at this often


def link_key(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def measured(value: float) -> float:
    """A probe's figure to three significant digits, as the snapshot keeps it: within the
    probes' own noise, and a few characters per link instead of seventeen (the snapshot
    carries three links per node)."""
    return float(f"{value:.3g}")


def _finite(value: object) -> TypeGuard[float]:
    """A number a snapshot can carry (JSON has no NaN or infinity)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) \
        and math.isfinite(value)


class JoinPhase(enum.Enum):
    """Where the scheduler's side of one scale-out stands.

    ``COMMANDED``: the neighbours are chosen, the links and the policy that adds the node
    are published, and the :class:`Replicate` went to the new node and every source; it waits
    for the node's :class:`Replicated`. A repeated join request while commanded resends the
    command (a broker restart can lose it). ``ORPHANED``: every source has gone; the join is
    set aside and planned again from the members left, or the node bootstraps if none is.

    A join ends when its node reports :class:`Replicated` (it is active: a ``scale-out``
    event), when the node is scaled in (failure, leave, worker exit, divergence), or when its
    worker refuses the state (:class:`StateRefused`); the record is dropped then.
    """

    COMMANDED = "commanded"
    ORPHANED = "orphaned"


@dataclass
class Join:
    """One scale-out in flight: the scheduler holds exactly one per joining node."""

    node: str
    requested_at: float  # monotonic, for the scale-out event's delay
    command: Replicate  # what the node and its sources were told (resent as it is)
    phase: JoinPhase = JoinPhase.COMMANDED
    declined: dict[str, str] = field(default_factory=dict)  # source -> why it did not serve
    holds: int = 0  # the step of the state its worker held when it asked (0: fresh)

    @property
    def member_from(self) -> int:
        """The first round the node takes part in (one past the replicated step)."""
        return self.command.version_step + 1

    def serving(self, active: Iterable[str]) -> set[str]:
        """Its sources that may still serve it: active members that did not decline."""
        return set(active).difference(self.declined).intersection(self.command.sources)


class Negotiator:
    """Applies primitives to the scheduler's state and queues worker commands."""

    def __init__(self, sched: Scheduler, clock: Clock, step_of: Callable[[str], int],
                 alive: Callable[[str], bool] = lambda _node: True,
                 strategy: Strategy = "chaos", wire: str = "fp32",
                 sync: SyncMode = EVERY_STEP,
                 reported: Callable[[str], int] | None = None,
                 keepers: Keepers | None = None,
                 shelf_of: Callable[[str], str] = lambda _node: "") -> None:
        self.sched = sched
        self.strategy = strategy  # scale-out: chaos (planned split) or single (EDL+)
        self.wire = wire  # gradient wire format, put in every policy (all members alike)
        self.sync = sync  # every-step or diloco, likewise
        self.pinned: tuple[str, ...] = ()  # the parts of them an operator pinned, likewise
        self.clock = clock
        self.step_of = step_of  # a member's step now, extrapolated at its rate (timing)
        # The step a node last said it holds, not extrapolated: what a join holds. A node cut
        # off stands still; extrapolated at its old rate, a partitioned node linked back a
        # second later looked ahead of the members, and the cluster started over from its
        # stale state (the simulator's seed 27921).
        self.reported = reported or step_of
        self.alive = alive  # is the node's daemon up, as far as the scheduler knows?
        # Copies of the snapshots on boxes that do not train (None: no copies), and where
        # each box's shelf takes them ("": it has none), from its presence.
        self.keepers = keepers
        self.shelf_of = shelf_of
        self._kept_at = -1.0  # when the copies were last looked at
        self.out: list[tuple[str, CommandBody]] = []  # (node, command) for the agent to send
        self._progress: deque[tuple[float, int]] = deque()  # (monotonic, max member step)
        self.joins: dict[str, Join] = {}  # joining node -> its scale-out in flight
        # Bandwidth tests each link has had under this scheduler: the policy controller
        # tells a new reading from one seen again (rates are kept to three digits, so two
        # tests of a shaped link often read the same).
        self.bw_readings: dict[tuple[str, str], int] = {}
        # The neighbours each node asked for at its join. One that was not a member then (it
        # joined at the same moment) gets its link once both are: boxes started together each
        # named the others, and the overlay kept only their links to the first.
        self._wants: dict[str, set[str]] = {}
        # With no member left: joiners waiting for a holder of the state (node -> its step),
        # and since when the cluster has had no member.
        self.held: dict[str, int] = {}
        self._empty_since: float | None = None
        # leaving node -> the step its leave takes effect, and its worker's address till then
        self._leaving: dict[str, tuple[int, str]] = {}
        # The last member's leave, held while it is the source of a join in flight
        # (node -> the step it asked at): see :meth:`leave`.
        self._handing_over: dict[str, tuple[int, float]] = {}  # node -> (step, held since)
        self._blamed: dict[str, dict[str, float]] = {}  # node -> {peer whose link failed: when}
        self._heard: set[str] = set()  # nodes whose heartbeats this scheduler has had
        # The step each node's worker holds, from its heartbeat or its join (None: none).
        self._holds: dict[str, int | None] = {}
        # The newest snapshot on each node's disk, from its heartbeat (-1: none).
        self._on_disk: dict[str, int] = {}
        # The step each member became one at (its bootstrap's, or its replica's): no member
        # is behind it, whatever its daemon said before its worker's first poll.
        self._member_at: dict[str, int] = {}
        # Members (and joiners) failed by silence, not heard since: cut off, a member trains on
        # unseen until its chaosd finds itself deaf, and may come back holding steps we never
        # heard of (see :meth:`join`).
        self._silenced: set[str] = set()
        # Members set aside while we still hear them (a partition, blamed links): node ->
        # {member that went on: the step it became one at}. See :meth:`_kept_partners`.
        self._aside: dict[str, dict[str, int]] = {}
        # Joins that wait for heartbeats: node -> (until when, whose, the join's arguments).
        self._unheard: dict[str, tuple[float, frozenset[str],
                                       tuple[str, list[str], dict[str, float] | None, int]]] = {}
        # Members set aside as stragglers (node -> why), their joins held until the policy
        # controller lets them back (:meth:`stand_aside`, :meth:`let_back`).
        self.benched: dict[str, str] = {}

    # --- helpers --------------------------------------------------------------------------
    def members(self) -> list[str]:
        return sorted(n for n, r in self.sched.nodes.items() if r.state in MEMBER_STATES)

    def _cmd(self, node: str, cmd: CommandBody) -> None:
        self.out.append((node, cmd))

    def _link(self, a: str, b: str) -> LinkRecord | None:
        key = link_key(a, b)
        return next((lk for lk in self.sched.links if (lk.a, lk.b) == key), None)

    def _add_link(self, a: str, b: str) -> bool:
        if self._link(a, b) is not None:
            return False
        ka, kb = link_key(a, b)
        self.sched.links.append(LinkRecord(a=ka, b=kb, state="up",
                                           measured_at=self.sched.now_ms()))
        # Only an end whose peer has a worker to dial is told: a node without one (its worker
        # exited, or never attached) has no data-plane address, and its worker, once it
        # asks to join, gets its links anew. An empty address used to reach workers as a
        # command they could not parse.
        for end, far in ((a, b), (b, a)):
            addr = self.sched.nodes[far].data_addr
            if valid_addr(addr):
                self._cmd(end, Connect(peer=far, addr=addr))
        self.sched.dirty = True
        return True

    def _drop_links(self, node: str, peer: str | None = None) -> list[str]:
        """Remove ``node``'s links (or only the one to ``peer``); tell the survivors."""
        dropped = []
        for lk in list(self.sched.links):
            if node in (lk.a, lk.b) and (peer is None or peer in (lk.a, lk.b)):
                other = lk.b if lk.a == node else lk.a
                self.sched.links.remove(lk)
                dropped.append(other)
                for end, far in ((node, other), (other, node)):
                    if self.sched.nodes.get(end) and self.sched.nodes[end].state in MEMBER_STATES:
                        # The policy published next goes without the link: the end closes
                        # it only once it holds that one (and so every one before it).
                        self._cmd(end, Disconnect(peer=far,
                                                  policy_version=self.sched.policy_version + 1))
        self.sched.dirty = True
        return dropped

    def _heal_overlay(self) -> None:
        """A member that went took its links along: reconnect the members it held together.

        Links are the overlay the all-reduce tree runs on, not the network: when the hub of a
        star fails, its survivors lose every link while their boxes still reach each other.
        Left so, the partition rule kept one of them and made the others rejoin by scale-out
        (the simulator's seed 3). Each split-off part is linked to the largest one; if the
        network is truly cut there, the new link fails and its report is a partition.

        First among the active members: a joiner is left out of the policies that take effect
        before its state is in, so a path through it leaves those disconnected (seed 227).
        Then with the joiners too: a joiner is a member of every policy from its own step on,
        and one whose only link went with its source was put aside by the partition rule
        while it trained as a member (the simulator's seed 20637, 60 s: the last member left
        once one of its three joiners held the state, and the other two, members by then,
        rejoined with a newer state than the stale step heard of the heir, which started the
        cluster over from theirs).
        """
        active = self._active()
        self._link_parts(active)
        self._link_parts(active + sorted(n for n in self.joins if n not in active and (
            r := self.sched.nodes.get(n)) is not None and r.state == "joining"))

    def _link_parts(self, nodes: list[str]) -> None:
        """Link each part of the overlay among ``nodes`` to the largest part."""
        adj: dict[str, set[str]] = {m: set() for m in nodes}
        for lk in self.sched.links:
            if lk.a in adj and lk.b in adj:
                adj[lk.a].add(lk.b)
                adj[lk.b].add(lk.a)
        parts: list[set[str]] = []
        seen: set[str] = set()
        for start in nodes:
            if start in seen:
                continue
            part, todo = set(), [start]
            while todo:
                n = todo.pop()
                if n not in part:
                    part.add(n)
                    todo.extend(adj[n] - part)
            seen |= part
            parts.append(part)
        if len(parts) < 2:
            return
        parts.sort(key=lambda p: (-len(p), min(p)))
        main = parts[0]
        for part in parts[1:]:
            self._add_link(min(part), min(main))
            main |= part

    def _set_neighbors(self) -> None:
        adj: dict[str, set[str]] = {}
        for lk in self.sched.links:  # once over the links, not once per node
            adj.setdefault(lk.a, set()).add(lk.b)
            adj.setdefault(lk.b, set()).add(lk.a)
        for node, rec in list(self.sched.nodes.items()):
            nbrs = sorted(adj.get(node, ()))
            if nbrs != rec.neighbors:
                self.sched.nodes[node] = replace(rec, neighbors=nbrs)

    def max_step(self) -> int:
        """The newest step a member is at. A member just bootstrapped from a snapshot still
        reports step 0 until its worker polls: a join planned in that moment took effect at
        step 3 while the member stood at 2000, and its rounds waited for a joiner with no
        state until they timed out (the soak, 15 s per power cut)."""
        return self._newest(self.members())

    def _newest(self, nodes: Iterable[str]) -> int:
        """The newest step any of ``nodes`` is at: the step its daemon said, and never
        below the one it became a member at (0 for none)."""
        return max((max(self.step_of(n), self._member_at.get(n, 0)) for n in nodes), default=0)

    def observe_worker(self, node: str, state: str, step: int, attached: bool = True,
                       snapshot: int = -1, policy_version: int | None = None) -> None:
        """A heartbeat says what ``node``'s worker is: one we list as joining whose worker is
        already active finished its join, and its ``replicated`` report was lost (sent to a
        scheduler that died the moment it went out: the simulator's seed 1389). Left joining,
        it was no holder of the state, and the next joiner bootstrapped a fresh model."""
        self._heard.add(node)
        self._silenced.discard(node)
        self._holds[node] = step if attached else None
        self._on_disk[node] = snapshot
        rec = self.sched.nodes.get(node)
        if rec is None or rec.state != "joining" or state != "active":
            return
        join = self.joins.get(node)
        if join is not None and step < join.command.version_step:
            # Behind the replica it was sent to fetch: the worker's state from before this
            # join (a box thawed from a freeze still says "active"), not its end. Taken for
            # done, the node was a member while its worker fetched, and the rounds waited on
            # it until the join timed out (the soak: no step for 300 s).
            return
        if (join is not None and policy_version is not None
                and policy_version < join.command.policy_version):
            # Its rounds were committed under a policy older than the one this join adds it
            # by: a member set aside that trained on alone before it heard so, on its own
            # line of states. Taken for done, two lines of step 373 and 374 were members of
            # one cluster (the e2e power cut with the broker: a member bootstrapped from an
            # older snapshot was set aside for a newer one, and trained four steps past the
            # joiner's step before its heartbeat came).
            return
        log.warning("%s trains (step %d) but its join was never reported done: done now",
                    node, step)
        self.replicated(node, Replicated(version=step))
        if step > self.sched.step:
            self.sched.step = step

    def observe_progress(self) -> None:
        """Sample the cluster's step (called on heartbeats) to learn the step rate."""
        now, step = self.clock.monotonic(), self.max_step()
        if self._progress and now - self._progress[-1][0] < 0.2:
            return
        self._progress.append((now, step))
        while self._progress and now - self._progress[0][0] > RATE_WINDOW_S:
            self._progress.popleft()

    def lead(self) -> int:
        """Steps ahead at which a planned change takes effect: STEP_MARGIN, or more when
        the cluster steps so fast that the policy could not reach every worker in time (a
        worker that starts the round under the old policy makes everyone rerun it)."""
        rate = self.step_rate()
        if rate is None:
            return STEP_MARGIN
        return max(STEP_MARGIN, math.ceil(rate * POLICY_LEAD_S))

    def step_rate(self) -> float | None:
        """The cluster's steps per second over the last RATE_WINDOW_S (None: not measured)."""
        if len(self._progress) < 2:
            return None
        (t0, s0), (t1, s1) = self._progress[0], self._progress[-1]
        return max(0, s1 - s0) / max(t1 - t0, 1e-3)

    # --- policy ---------------------------------------------------------------------------
    def publish_policy(self, effective_step: int) -> SyncPolicy | None:
        """Publish the next sync policy, effective at ``effective_step``.

        A joining node must not become a member before the step its replica is taken for,
        or the others would wait for a node that has no state yet. So a policy that takes
        effect earlier leaves it out, and a later one adds it back at its own step: one per
        step at which joiners become members. Adding them all at the last one dropped a
        joiner already named from an earlier round out of its rounds; its worker, a member
        by then, saw itself outside its next round's policy and asked to join again (the
        simulator's seed 1721).
        """
        early = {n: j.member_from for n, j in self.joins.items()
                 if n in self.sched.nodes and self.sched.nodes[n].state == "joining"
                 and j.member_from > effective_step}
        policy = self._publish(effective_step, exclude=list(early))
        for step in sorted(set(early.values())):
            policy = self._publish(step, exclude=[n for n, s in early.items() if s > step])
        return policy

    def _publish(self, effective_step: int, exclude: tuple[str, ...] | list[str]
                 ) -> SyncPolicy | None:
        self._set_neighbors()
        members = [m for m in self.members() if m not in exclude]
        if not members:
            # Said, not left unsaid: a worker whose newest policy still named it waited for
            # a round that could never come, while the scheduler, holding joiners back for a
            # holder of the state, never heard from it (the simulator's seed 52).
            if self.sched.policy is None or not self.sched.policy.members:
                return self.sched.policy
            return self._publish_empty(effective_step)
        weights = {link_key(lk.a, lk.b): (lk.bandwidth_mbps or 1.0)
                   for lk in self.sched.links if lk.state == "up"}
        plan = spanning_tree(members, weights)
        if not plan.connected:
            kept = sorted(self._keep(plan.components))
            parts = [sorted(c) for c in plan.components]
            plan = spanning_tree(kept, weights)
            for node in members:
                if node not in kept:
                    self.sched.set_node(node, state="standby")  # waits for a link back
                    self._note_aside(node, kept)
            self.sched.record("partition", parts=parts, kept=kept)
            log.warning("partition %s: %s keeps training", parts, kept)
            members = kept
        try:
            policy = SyncPolicy.build(self.sched.policy_version + 1, members, plan.edges,
                                      plan.root, effective_step,
                                      {n: self.sched.nodes[n].data_addr for n in members},
                                      wire=self.wire, sync=self.sync,
                                      chunk_kib=self._chunk_kib(plan.edges),
                                      pinned=self.pinned)
        except PolicyError as exc:  # pragma: no cover - spanning_tree guarantees a tree
            log.error("could not build a sync policy: %s", exc)
            return self.sched.policy
        self.sched.policy_version = policy.version
        self.sched.policy = policy
        self.sched.policies.append(policy)
        self.sched.dirty = True
        return policy

    def _publish_empty(self, effective_step: int) -> SyncPolicy:
        """A policy naming no member: every worker that a policy of ours or an older one
        names finds itself outside it, and asks to join, saying the step it holds."""
        empty = SyncPolicy.build(self.sched.policy_version + 1, [], [], "", effective_step,
                                 wire=self.wire, sync=self.sync, pinned=self.pinned)
        self.sched.policy_version = empty.version
        self.sched.policy = empty
        self.sched.policies.append(empty)
        self.sched.dirty = True
        return empty

    def _keep(self, parts: tuple[frozenset[str], ...]) -> frozenset[str]:
        """The part that trains on: the most holders of the state up (active members, not
        joiners), then the most members up, then the most members, then ours.

        A part of joiners alone holds no state: keeping it over one with an active member threw
        the state away (the simulator's seed 1: the hub of a star froze, the new scheduler
        found its own joining node cut off from the rest, and bootstrapped it from a fresh
        model while the holder was set aside). Members counted up are those whose daemons we
        still hear: a part whose members are about to be declared failed would take the state
        with it. Our own part wins a tie, since we are surely up and reach it: a scheduler cut
        off with one peer used to keep that peer (the lower id), put itself aside to rejoin
        from it, and then waited for a source that was gone.
        """
        def holders(p: frozenset[str]) -> int:
            return sum(1 for n in p if self.alive(n) and self.sched.nodes[n].state == "active")

        return min(parts, key=lambda p: (-holders(p), -sum(map(self.alive, p)), -len(p),
                                         self.sched.me not in p, min(p)))

    # --- primitives -----------------------------------------------------------------------
    def join(self, node: str, data_addr: str, wanted: list[str],
             rtts: dict[str, float] | None = None, step: int = 0) -> None:
        """Scale-out: admit ``node`` (its worker holds the state of ``step``; 0: a fresh
        model). The first member bootstraps the cluster; with no member left, only one that
        holds the cluster's newest state does so at once (see :meth:`tick`)."""
        rec = self.sched.nodes.get(node)
        if rec is None:
            self.sched.set_node(node, state="standby")
        self.sched.set_node(node, data_addr=data_addr)
        if node in self.benched:
            if len(self._active()) >= 2:
                # A straggler set aside: its worker holds its state and asks again every few
                # seconds, at no cost, until the controller lets it back (let_back).
                self._holds[node] = step
                return
            # Too few members train without it (the others went): a straggler beats none.
            del self.benched[node]
        # Sources hold the state: active members, never another joiner.
        members = [m for m in self._active() if m != node]
        pending = self.joins.get(node)
        if pending is not None and self.sched.nodes[node].state == "joining":
            # A repeated request while the first is in flight: the worker asks again when it
            # got no command, which a broker restart can lose (QoS 1 without persistence).
            # It says what it holds now: a replica it restored since, its report lost or
            # too late, is what an orphaned join is planned again with (the simulator's seed
            # 570: planned with the step of its first request, 60, while it held 148, and an
            # older state started the cluster over).
            pending.holds = max(pending.holds, step)
            self._holds[node] = step
            self._send_replicate(pending)
            return
        self._leaving.pop(node, None)
        self._unheard.pop(node, None)
        self._holds[node] = step
        # Ahead of every member, and of every node up that holds a state: a node back from a
        # cut with a newer state in memory, not a member here yet, is where the cluster must
        # go on from, not the joiner's older snapshot (the simulator's seed 1775, 30 s). The
        # joiner then pulls from the members; the newer state comes with its holder's join.
        # Ahead of the members by more than the lead, and at least the newest step an active
        # member was heard at: not that step plus the lead, which members that lag are not
        # (the simulator's seed 2521: a new scheduler's stale view kept the cut-off site's two
        # members, at 407, and a joiner holding the 420 its site had reached pulled 409).
        if (members and self._clearly_ahead(step) and self._ahead_of_nodes_up(node, step)
                and not self._kept_partners(node)):
            unheard = [m for m in members if m not in self._heard and m != self.sched.me]
            if unheard:
                # What we know of them is the snapshot's step, which lags: a scheduler a
                # moment old took a member that had trained on for one behind the joiner and
                # started the cluster over from the joiner's older state (the simulator's
                # seed 36). Judged when their heartbeats come (tick).
                self._wait_to_hear(node, unheard, (data_addr, wanted, rtts, step))
                return
            # The joiner holds a newer state than every active member (they stalled, frozen or
            # cut off, while it trained on elsewhere): the cluster goes on from the joiner's
            # state, and the members pull it (the simulator's seed 2400: it took their older
            # state instead, and its steps were lost while it held them). Only clearly ahead:
            # what we know of the members' steps lags by a heartbeat or a poll (seed 13).
            log.warning("%s holds step %d, ahead of every member (%d): the cluster goes on "
                        "from it", node, step, self.max_step())
            for m in members:
                self.sched.set_node(m, state="standby")
            self._bootstrap(node, step)
            for m in members:
                self.join(m, self.sched.nodes[m].data_addr, [node], step=self._held_by(m))
            return
        if not members and self._recall_leaver(newer_than=step):
            members = [m for m in self._active() if m != node]
        if not members:
            # Nodes up whose heartbeats we have not had may hold a newer state: a site back
            # a moment before ours was heard only by its presence, and our older state started
            # the cluster over (the simulator's seed 107). Judged when they are heard (tick).
            up = [n for n, r in self.sched.nodes.items() if n != node and self.alive(n)
                  and r.state not in ("failed", "left")]
            unheard = [n for n in up if n not in self._holds and n != self.sched.me]
            if unheard:
                self._wait_to_hear(node, unheard, (data_addr, wanted, rtts, step))
                return
            # A joiner whose sources went holds its state still (the simulator's seed 35: a
            # node back from a cut started the cluster over from an older state while one
            # that had trained on waited on a source that went); so does a node up whose
            # worker holds a newer state, not yet asking to join.
            newest = max(self.sched.step, self._held_elsewhere(node))
            silent = sorted(n for n in self._silenced if n != node)
            if step >= newest and silent:
                # A member cut off trained on unseen until its chaosd found itself deaf; its
                # site may be back this moment, our joiner's request first (the simulator's
                # seed 353: a joiner holding its disk's 340 asked the moment its site was back
                # and started the cluster over before the last member, back with 349, was
                # heard). Judged when they are heard, or after SILENT_WAIT_S (tick).
                self._wait_to_hear(node, silent, (data_addr, wanted, rtts, step),
                                   wait=SILENT_WAIT_S)
                return
            if step >= newest:
                self._bootstrap(node, step)
                return
            # The state's holders are gone for now (failed, cut off, rebooting): a fresh or
            # older state must not start the cluster over while one may come back (the
            # simulator's seed 4: a site back first bootstrapped a fresh model while the
            # other site, still cut off, held the state).
            if self.held.get(node) != step:  # (a join asked again is held again, quietly)
                log.warning("%s holds step %d, the cluster was at %d: waiting up to %gs for "
                            "a holder of the state", node, step, self.sched.step, HOLD_S)
            self.held[node] = step
            self.sched.set_node(node, state="standby")
            self._unname(node)
            # Past the hold, the best state held starts it over, not the last to ask (the
            # simulator's seed 397: a fresh joiner did, beside a holder of step 279).
            self._start_over_if_due()
            return
        requested_at = self.clock.monotonic()
        # Self-loops and strangers are dropped; without a valid wish, the nearest members by
        # the RTTs the joining node measured (unmeasured ones last), ties by id.
        def distance(m: str) -> tuple[float, str]:
            rtt = (rtts or {}).get(m)
            return (float(rtt) if isinstance(rtt, (int, float)) else float("inf"), m)

        self._wants[node] = {n for n in wanted if n != node}
        chosen = [n for n in wanted if n in members] or sorted(members, key=distance)[
            :AUTO_NEIGHBORS]
        self._drop_links(node)
        for peer in chosen:
            self._add_link(node, peer)
        version_step = self.max_step() + self.lead()
        self.sched.set_node(node, state="joining")
        command = Replicate(
            version_step=version_step, new=node,
            sources={p: self.sched.nodes[p].data_addr for p in chosen},
            policy_version=0, neighbors=chosen, strategy=self.strategy,
            links={p: LinkEstimate(rtt_ms=(rtts or {}).get(p)) for p in chosen})
        join = self.joins[node] = Join(node, requested_at, command, holds=step)
        # A node that the policy in force still names (a member that asks to join again, a
        # joiner planned anew) would hold up every round until its new replica's step, and
        # that state is one those rounds must make: a policy without it governs at once (the
        # simulator's seed 1721; soak fault 12, a 299 s stall until the join timed out).
        before = self.sched.policy_version
        policy = self.publish_policy(effective_step=0 if self._named(node)
                                     else join.member_from)
        adds = self._adding(node, before, policy)
        join.command = replace(command, policy_version=adds.version if adds else 0)
        self._send_replicate(join)

    def _adding(self, node: str, since: int, last: SyncPolicy | None) -> SyncPolicy | None:
        """Of the policies published after version ``since`` (``last`` the newest), the one
        that makes ``node`` a member: not always the last, since another joiner planned with
        a longer lead (the cluster stepped faster then) is added by a later one. Named by that
        later one, a joiner's sources waited for it to govern their next round before they
        served, while the rounds from its first step already needed it: neither served nor
        ran (soak fault 22, stalls of 101 s and 61 s)."""
        return next((p for p in self.sched.policies if p.version > since
                     and node in p.members), last)

    def _unname(self, node: str) -> None:
        """A node held back must not train on a policy that still names it: a new scheduler
        inherited a policy naming a joiner its predecessor had planned; the joiner's pull
        from that predecessor ended, it trained alone on that policy while held here as
        holding nothing, and an older state started the cluster over (the simulator's seed
        567). Left out at once, its worker asks again, saying it holds the replica.

        A scheduler without the cluster's view (elected after its predecessor died while the
        broker was down, which lost the retained view) has no policy of its own, and the
        holders of the newer state it waits for train under one it never saw: they never
        asked, and past HOLD_S the joiner's older state started the cluster over
        (test_split_brain: the rebooted scheduler's disk held 380, the survivors 396). A
        policy of our term naming nobody is newer than theirs: they ask to join, saying what
        they hold, and the newest holder goes on."""
        if self._named(node):
            self.publish_policy(effective_step=0)
        elif self.sched.policy is None:
            log.warning("no view of the cluster's policy: asking every worker to join")
            self._publish_empty(effective_step=0)

    def _named(self, node: str) -> bool:
        """Does the newest policy name ``node`` as a member?"""
        return self.sched.policy is not None and node in self.sched.policy.members

    def _empty_for(self) -> float:
        """How long the cluster has had no active member (0 while it has one)."""
        if self._active():
            self._empty_since = None
            return 0.0
        now = self.clock.monotonic()
        if self._empty_since is None:
            self._empty_since = now
        return now - self._empty_since

    def _note_members(self) -> None:
        """After a member went: the clock of an empty cluster starts when the last one goes
        (a clock left running from an earlier empty spell let a joiner start over at once)."""
        if self._active():
            self._empty_since = None
        elif self._empty_since is None:
            self._empty_since = self.clock.monotonic()

    def _bootstrap(self, node: str, step: int) -> None:
        """``node`` becomes the only member, from the state its worker holds."""
        held = self.held.pop(node, None)
        known = self.sched.step
        self.sched.set_node(node, state="active")
        self._member_at[node] = step
        self._aside.pop(node, None)
        policy = self.publish_policy(effective_step=0)
        version = policy.version if policy else 0
        # Said, not left to the worker to infer from a policy naming it alone: joins that came
        # a moment later publish newer policies naming them too, and a worker that first looked
        # then waited for a replica nobody could send.
        self._cmd(node, Bootstrap(new=node, policy_version=version))
        self.sched.record("scale-out", node=node, delay_ms=0.0, bootstrap=True,
                          policy_version=version)
        if known > 0 or step > 0:  # a cluster that had a state goes on from this one (a
            # snapshot's, perhaps, with the steps since lost), or starts over from a fresh model.
            # Known 0 with a state held: the broker lost the cluster's view with the power,
            # and how many steps the cut cost is known to nobody (None), but it is said.
            kind: EventKind = "state-restored" if step > 0 else "state-lost"
            self.sched.record(kind, node=node, step=step, source=node,
                              steps_lost=max(0, known - step) if known > 0 else None,
                              held=held is not None)
        self.sched.step = step
        self._empty_since = None
        waited, self.held = sorted(self.held.items()), {}
        for other, their in waited:  # those who waited pull from it now (or, if ahead of
            # it, start the cluster again themselves: join may come back here)
            self.join(other, self.sched.nodes[other].data_addr, [node], step=their)

    def tick(self) -> None:
        """Called every tick: start over from the best state held back, once no holder of
        the newest one has come back within HOLD_S; let a last member leave once it handed
        the state over; judge the joins waiting for heartbeats."""
        self._start_over_if_due()
        self._hand_over_if_due()
        now = self.clock.monotonic()
        if self.keepers is not None and now - self._kept_at >= KEEP_EVERY_S:
            self._kept_at = now
            self._keep_copies(self.keepers)
        for node, (until, whose, args) in sorted(self._unheard.items()):
            if whose <= self._heard or now >= until:
                self._heard.update(whose)  # judged now, on what we know
                self._silenced.difference_update(whose)
                for n in whose:
                    self._holds.setdefault(n, None)
                self.join(node, *args[:3], step=args[3])

    def _keep_copies(self, keepers: Keepers) -> None:
        """Order the copies of the snapshots that are due (see :mod:`daemon.cluster.keepers`)."""
        boxes = {n: Box(disk=self._on_disk.get(n, -1), worker=self._holds[n] is not None,
                        member=r.state == "active", shelf=self.shelf_of(n))
                 for n, r in self.sched.nodes.items()
                 if n in self._holds and self.alive(n) and r.state not in ("failed", "left")}
        keepers.observe(boxes)
        due = (keepers.copies_due(boxes) if self._active() else
               keepers.restore_due(boxes, self.held) if self.held else [])
        for holder, cmd in due:
            self._cmd(holder, cmd)

    def _wait_to_hear(self, node: str, whose: list[str],
                      args: tuple[str, list[str], dict[str, float] | None, int],
                      wait: float = UNHEARD_WAIT_S) -> None:
        """Judge ``node``'s join once ``whose`` heartbeats came, or ``wait`` passed."""
        self._unheard[node] = (self.clock.monotonic() + wait, frozenset(whose), args)
        log.info("%s holds step %d; waiting for the heartbeats of %s", node, args[3],
                 ", ".join(whose))

    def _clearly_ahead(self, step: int) -> bool:
        """Is a state of ``step`` clearly newer than the active members'? Joiners do not
        count: they pull (seed 2521: one holding the same 340 as the joiner, counted as a
        member, made the joiner look level with members at 330)."""
        return step >= self.sched.step and step > self._newest(self._active()) + self.lead()

    def _note_aside(self, node: str, kept: Iterable[str]) -> None:
        """``node``, a member we still hear, leaves the rounds while ``kept`` go on."""
        self._aside[node] = {m: self._member_at.get(m, 0) for m in kept if m != node}

    def _kept_partners(self, node: str) -> list[str]:
        """The members that went on when ``node`` was set aside (a partition, or its links
        blamed), members ever since: they trained in lockstep with it until then, so they hold
        at least its state, however old their last heartbeat's step is (the simulator's seed
        448: a data-plane cut blamed the scheduler's own node, the one member left trained on
        alone to 279, and the node set aside, at 277, looked clearly ahead of the 270 that
        member's heartbeat had said, and started the cluster over from its older state)."""
        marks = self._aside.get(node, {})
        return [m for m, at in marks.items() if m in self._active()
                and self._member_at.get(m, 0) == at]

    def _held_by(self, node: str) -> int:
        """The step ``node`` holds, as it last said: its worker's (a restored snapshot,
        before the worker's first poll moves the daemon's own step), else its daemon's."""
        return max(self.reported(node), self._holds.get(node) or 0)

    def _ahead_of_nodes_up(self, node: str, step: int) -> bool:
        return step >= self._held_elsewhere(node)

    def _held_elsewhere(self, node: str) -> int:
        """The newest state a node other than ``node`` holds, as far as we know: the other
        joins' (their sources may have gone), the workers' of the nodes up, and the newest
        snapshot on their disks, which their workers restore when they start (-1: none).
        Without the disks, after a power cut of every box the first to ask started the
        cluster over from its snapshot while a box whose worker was still starting held a
        newer one (the e2e power-cut test, once the members' snapshots fell on different
        steps)."""
        up = [n for n, r in self.sched.nodes.items() if n != node and self.alive(n)
              and r.state not in ("failed", "left")]
        return max([-1, *(j.holds for n, j in self.joins.items() if n != node and self.alive(n)),
                    *(h for n in up if (h := self._holds.get(n)) is not None),
                    *self._disks_up(up)])

    def _disks_up(self, up: list[str]) -> list[int]:
        return [self._on_disk.get(n, -1) for n in up]

    def _awaited(self, step: int) -> list[str]:
        """Who may still bring a state newer than ``step``: every box the cluster knows that
        has not asked to join yet, unless it is up and we know it holds nothing newer (no
        worker attached, no newer snapshot on its disk). A box we do not hear (failed, cut
        off, frozen) may hold one in memory (the simulator's seed 67: a frozen box thawed as
        a new scheduler started over from a fresh model), and one up that we have not heard
        since may too (seed 1119: a site back 15 ms before). Our own box too: its worker, hung
        and killed, restarts from the snapshot on its disk (seed 1071). After a power cut of
        every box, each comes back and asks, holding its newest snapshot: nobody is awaited."""
        def may_bring(n: str) -> bool:
            if not self.alive(n) or self.sched.nodes[n].state == "failed" or n not in self._holds:
                return True
            held = self._holds[n]
            return (held is not None and held > step) or self._on_disk.get(n, -1) > step
        return sorted(n for n, r in self.sched.nodes.items()
                      if n not in self.held and r.state != "left" and may_bring(n))

    def _start_over_if_due(self) -> None:
        """With no member: the best state held by a node that is up, at once when nobody may
        bring a newer one (every member back from a power cut, each with its snapshot), else
        after HOLD_S."""
        up = [n for n in self.held if self.alive(n)]
        empty_for = self._empty_for() if self.held else 0.0
        if up and not self._awaited(max(self.held[n] for n in up)):
            best = max(up, key=lambda n: (self.held[n], n))
            if max(self.held.values()) <= self.held[best]:
                self._bootstrap(best, self.held[best])
                return
        if up and empty_for >= HOLD_S:
            best = max(up, key=lambda n: (self.held[n], n))  # most steps, then id
            # A held node with a newer state, silent for now (frozen, cut off), is waited
            # for one more HOLD_S: the simulator's seed 397 started over from a fresh model
            # the moment before the holder of step 279 thawed.
            if max(self.held.values()) <= self.held[best] or empty_for >= 2 * HOLD_S:
                self._bootstrap(best, self.held[best])

    def _send_replicate(self, join: Join) -> None:
        """Send ``join``'s command to the new node and its sources (again, after a lost
        one): every neighbour snapshots and serves; the new node plans who sends which bytes."""
        for target in [join.node, *join.command.sources]:
            self._cmd(target, join.command)

    def _active(self) -> list[str]:
        return [m for m in self.members() if self.sched.nodes[m].state == "active"]

    def _replan_orphans(self) -> None:
        """Joins whose every source is gone start over from the members left, or bootstrap
        if none is: the new node would otherwise retry a dead source until its timeout.
        All are set aside first, so that one bootstrapping finds no stranded joiner."""
        active = self._active()
        # A source that declined to serve counts as gone (the simulator's seed 1028: one
        # source declined, the other's worker died, and the join waited on the decliner).
        orphans = [j for j in self.joins.values()
                   if self.sched.nodes[j.node].state == "joining" and not j.serving(active)]
        for join in orphans:
            log.warning("the sources of %s's join are gone (%s); planning it again",
                        join.node, ", ".join(join.command.sources))
            join.phase = JoinPhase.ORPHANED
            del self.joins[join.node]
            self.sched.set_node(join.node, state="standby")
        for join in orphans:  # with members that did not decline, if there are any
            left = self._active()
            self._plan_again(join, [m for m in left if m not in join.declined] or left)

    def _plan_again(self, join: Join, wanted: list[str]) -> None:
        """Plan ``join`` anew from ``wanted``, with the state it holds: planned as fresh, an
        older state started the cluster over while it waited (the simulator's seed 35)."""
        if self.joins.get(join.node) is join:
            del self.joins[join.node]
            self.sched.set_node(join.node, state="standby")
        heard = self._holds.get(join.node)  # its heartbeat's word, if newer than the request's
        holds = max(join.holds, heard if heard is not None else -1)
        self.join(join.node, self.sched.nodes[join.node].data_addr, wanted, step=holds)

    def replicated(self, node: str, report: Replicated) -> None:
        """The new node restored the state: scale-out is done."""
        join = self.joins.get(node)
        if join is not None and self._older_plan(join, report):
            log.info("%s restored step %d for plan v%s, an older one; its join waits for "
                     "step %d (v%d)", node, report.version, report.plan,
                     join.command.version_step, join.command.policy_version)
            return
        self.joins.pop(node, None)
        if self.sched.nodes.get(node) is None or self.sched.nodes[node].state != "joining":
            return
        self.sched.set_node(node, state="active")
        self._member_at[node] = join.command.version_step if join is not None else 0
        self._aside.pop(node, None)
        self._empty_since = None
        delay = None if join is None else (self.clock.monotonic() - join.requested_at) * 1000.0
        detail = report.detail()
        # Who declined: the sources' own reports, and what the new node heard from them (a
        # source's report may reach us after the new node's, since they publish apart).
        declined = {k: v[:200] for k, v in report.declined.items()}
        declined.update(join.declined if join is not None else {})
        detail.pop("declined", None)
        if declined:
            detail["declined"] = declined
        self.sched.record("scale-out", node=node, delay_ms=delay,
                          **{"policy_version": self.sched.policy_version, **detail})
        self._link_wanted(node)
        self._improve_policy()

    def _link_wanted(self, node: str) -> None:
        """``node`` became a member: the links it asked for, and those asked of it, to
        members that were not members at their join (measured at once by their ends' probes,
        and in the tree once measured: :meth:`_improve_policy`)."""
        active = set(self._active())
        for peer in sorted(active - {node}):
            if peer in self._wants.get(node, ()) or node in self._wants.get(peer, ()):
                self._add_link(node, peer)

    @staticmethod
    def _older_plan(join: Join, report: Replicated) -> bool:
        """Whether ``report`` is of another plan of this join than ours (a pull that ended
        after we planned the join anew: its command named another policy version). Made
        active with it, the node trained on an older state than a member held (the
        simulator's seed 397); its worker carries out our command next. A report that does
        not say its plan (an older worker) is taken as ours."""
        return report.plan is not None and report.plan != join.command.policy_version

    def leave(self, node: str, step: int) -> None:
        """Graceful scale-in at a step boundary a little ahead, like every planned change:
        the leaver takes part (with no samples) until then, so no round waits for it."""
        rec = self.sched.nodes.get(node)
        if rec is None or rec.state not in MEMBER_STATES:
            return
        since = self._handing_over.get(node, (step, self.clock.monotonic()))[1]
        if self._serves_last(node) or self._heir_may_ask(node, since):
            # The last member, and the source of a join in flight (or a node that can take
            # the state is up and may ask in a moment): it leaves once the new node holds
            # the state (tick), or the state would go with it (the simulator's seeds 319 and
            # 77973: a fresh or older state started the cluster over). Its worker takes part
            # in the rounds with no samples meanwhile, and serves the new node.
            if node not in self._handing_over:
                log.info("%s is the last member: its leave waits until a node that can "
                         "take the state holds it", node)
            self._handing_over[node] = (step, since)
            return
        self._handing_over.pop(node, None)
        t0 = self.clock.monotonic()
        self.joins.pop(node, None)
        self.held.pop(node, None)
        effective = max(step + 1, self.max_step() + self.lead())  # max_step still counts it
        self._leaving[node] = (effective, rec.data_addr)
        # First, so only survivors are told; and without its worker's address, so that no
        # later link report rejoins a node whose worker has gone (it asks to join anew).
        self.sched.set_node(node, state="left", data_addr="")
        self._drop_links(node)
        self._heal_overlay()
        self._note_members()
        policy = self.publish_policy(effective_step=effective)
        self.sched.record("scale-in", node=node, reason="leave",
                          delay_ms=(self.clock.monotonic() - t0) * 1000.0,
                          policy_version=policy.version if policy else None,
                          effective_step=effective)

    def stand_aside(self, node: str, why: str) -> SyncPolicy | None:
        """Scale-in of a live member that slows the cluster (a straggler), with ``why``.

        Planned like a leave, at a step boundary ahead, so no round waits for it; but its
        worker stays, holding its state, and asks to rejoin once the policy without it
        governs; its joins are held until :meth:`let_back`. None (nothing done) unless it is
        an active member, no join is in flight, and two active members stay.
        """
        rec = self.sched.nodes.get(node)
        active = self._active()
        if rec is None or rec.state != "active" or self.joins or len(active) < 3:
            return None
        effective = self.max_step() + self.lead()  # max_step still counts it
        self.sched.set_node(node, state="standby")
        self._note_aside(node, active)
        self.benched[node] = why
        # Its rounds wait for it until then: gone before, it is failed as a member (gone);
        # else its standby failure changed no policy, and the others waited for it for good
        # (the testbed, CI: set aside at step 823 for 845, killed at 823, no step after).
        self._leaving[node] = (effective, rec.data_addr)
        policy = self.publish_policy(effective_step=effective)
        self.sched.record("scale-in", node=node, reason="straggler", detail=why,
                          delay_ms=0.0, policy_version=policy.version if policy else None,
                          effective_step=effective)
        return policy

    def let_back(self, node: str) -> None:
        """A straggler set aside may rejoin: its next join request (within JOIN_ASK_AGAIN_S)
        is planned as any other."""
        self.benched.pop(node, None)

    def _serves_last(self, node: str) -> bool:
        """Whether ``node`` is the only active member and a source of a join in flight."""
        return self._active() == [node] and any(
            node in j.command.sources for n, j in self.joins.items()
            if self.sched.nodes[n].state == "joining")

    def _heir_may_ask(self, node: str, since: float) -> bool:
        """Whether ``node`` is the only active member while another node whose worker is
        attached waits outside (dropped a moment ago, say) and may ask to join, for at most
        HAND_OVER_S."""
        if self._active() != [node] or self.clock.monotonic() - since >= HAND_OVER_S:
            return False
        return any(n != node and r.state == "standby" and valid_addr(r.data_addr)
                   and self.alive(n) for n, r in self.sched.nodes.items())

    def _hand_over_if_due(self) -> None:
        """A last member's leave held for a join (:meth:`leave`) goes ahead once that join
        ended (the new node is a member now, or the join went another way), or when no
        join came within HAND_OVER_S."""
        for node, (step, since) in sorted(self._handing_over.items()):
            rec = self.sched.nodes.get(node)
            if rec is None or rec.state not in MEMBER_STATES:
                del self._handing_over[node]
            elif not self._serves_last(node) and not self._heir_may_ask(node, since):
                self.leave(node, step)

    def gone(self, node: str, reason: str) -> None:
        """Scale-in on failure: a new policy at once; rounds in flight are rerun."""
        self._handing_over.pop(node, None)
        if reason in ("failure", "daemon-left"):
            # Back, its box may not be the box it was (rebooted, or moved): it joins as any
            # node. A worker that exited or was killed on a box that stays is as slow as it
            # was: restarted, its join is held as before (the simulator: a straggler killed
            # and restarted at once was a member again within 2 s, 8x slow, for 9 s).
            self.benched.pop(node, None)
        was_member = ((self.sched.policy is not None and node in self.sched.policy.members)
                      or node in self.joins)
        if self._leaving.pop(node, (-1, ""))[0] > self.max_step():
            # A leaver that went before its leave took effect: the rounds until then wait
            # for it, so the policy without it must govern now, as for a failure.
            was_member = True
        self.joins.pop(node, None)
        # Unheard, it may have trained elsewhere since (another part's scheduler).
        self._aside.pop(node, None)
        if reason != "failure":
            # A worker that went holds nothing; one whose daemon went silent (cut off) may
            # still hold its state, and is counted again when it is back (tick): dropped, two
            # holders of the newest state cut off for a moment were forgotten, and a fresh
            # model started the cluster over while they waited (the simulator's seed 210).
            self.held.pop(node, None)
            self._holds[node] = None
            self._silenced.discard(node)
        else:
            self._holds.pop(node, None)  # back, what it holds is known from its heartbeats
            self._heard.discard(node)
            if was_member:
                self._silenced.add(node)
        self._unheard.pop(node, None)
        self._drop_links(node)
        if was_member and self.sched.nodes[node].state in MEMBER_STATES:
            self.sched.set_node(node, state="standby")  # the worker went, the daemon stays
            if reason != "failure":
                self._note_aside(node, self._active())
        if was_member and not self._active():
            self._recall_leaver()
        # Healed first: a joiner planned again may publish a policy without itself at once,
        # and the members the gone one held together must be linked by then.
        self._heal_overlay()
        # Before the policy: a joiner left with no source (and so no link) would otherwise be
        # cut off as a partition of its own.
        self._replan_orphans()
        if was_member and self._left_behind():
            # The members left hold an older state than the one that went: they are a part
            # the cluster had gone on without (cut off, their steps stood still), and a
            # policy of their own would build on it beside the newer state (the simulator's
            # seed 2290: a site cut off was failed, the other trained to 260 and lost power;
            # the cut-off site elected a scheduler, failed the rebooted boxes and had its two
            # members commit round 255 while those boxes asked to join holding 260). They
            # rejoin, holding their state, and the newest held starts the cluster again.
            behind = self._active()
            log.warning("%s hold step %d, behind the cluster's %d: they rejoin",
                        ", ".join(behind), self.max_step(), self.sched.step)
            for m in behind:
                self.sched.set_node(m, state="standby")
        self._note_members()
        if was_member:
            policy = self.publish_policy(effective_step=0)
            self.sched.record("scale-in", node=node, reason=reason, delay_ms=0.0,
                              policy_version=policy.version if policy else None)

    def _recall_leaver(self, newer_than: int = -1) -> bool:
        """The last member went while a node's leave (or set-aside) had not taken effect:
        that node's worker, still in the rounds until then, holds the newest state. It is the
        last member again, and a leaver leaves once a node that can take the state holds it,
        as :meth:`leave` holds the last member's. Gone with it, the state was lost (the
        simulator's seed 5955: a new scheduler took its own worker's leave, queued through a
        cut, before the exit of the other member's worker killed in it; that worker, started
        again, began the cluster over from its snapshot of 60 beside the leaver's 71). A
        joiner that finds no member recalls one holding a state newer than its own
        (``newer_than``) likewise: the last member's leave, taken the moment before the join
        came, was not held for it (seed 9635: the joiner started over from its 220 while the
        leaver's worker held 224). Whether one was recalled."""
        for node, (effective, addr) in sorted(self._leaving.items()):
            held = self._holds.get(node)
            # In effect already (the members went past its step; a straggler aside since
            # holds an older state than theirs), or its worker went: nothing to recall.
            if held is None or held >= effective or effective <= self.sched.step or not addr \
                    or not self.alive(node) or held <= newer_than:
                continue
            log.warning("%s is the last holder of step %d, its leave not yet in effect: it "
                        "stays a member until a node that can take the state holds it",
                        node, held)
            del self._leaving[node]
            self.sched.set_node(node, state="active", data_addr=addr)
            if self.benched.pop(node, None) is None:  # a straggler is simply kept
                self._handing_over[node] = (held, self.clock.monotonic())
            return True
        return False

    def doubt_own(self) -> None:
        """At election, with a view from before our daemon was paused: the others may have
        set our member aside meanwhile and trained on without it, and the snapshot that said
        so never reached us (a broker restart lost it). Our worker rejoins, saying what it
        holds, and a newer state held elsewhere goes on (the simulator's seed 3367: frozen
        8 s through a partition that set it aside, the new scheduler's own member reran round
        219 alone, beside the 220 that a box back from a power cut held)."""
        me = self.sched.me
        rec = self.sched.nodes.get(me)
        if rec is None or rec.state != "active":
            return
        log.warning("our view is from before this daemon was paused: our worker rejoins")
        self.sched.set_node(me, state="standby")
        self._note_members()
        self.publish_policy(effective_step=0)

    def _left_behind(self) -> bool:
        """Are the active members clearly behind the newest step an active member was heard
        at (``sched.step``)? Only judged on steps known fresh: ours (our worker's), or every
        member's own heartbeat; a member known only by the snapshot's lagging step may be
        ahead of it, and taken for behind, the part that holds the state would rejoin."""
        active = self._active()
        if not active or (self.sched.me not in active
                          and not all(m in self._heard for m in active)):
            return False
        return self.sched.step > self._newest(active) + self.lead()

    def link(self, a: str, b: str, up: bool, failed: bool = False) -> str | None:
        """connect-link / disconnect-link between two members; returns an error or None."""
        if a == b:
            return "a node cannot link to itself"
        members = self.members()
        for n in (a, b):
            if n not in self.sched.nodes:
                return f"unknown node {n!r}"
        t0 = self.clock.monotonic()
        if up:
            if not self._add_link(a, b):
                return None  # already there: nothing to do
            idle = [n for n in (a, b) if n not in members and self.sched.nodes[n].data_addr
                    and self.sched.nodes[n].state == "standby"]
            if idle and any(n in members for n in (a, b)):
                # A link back to a waiting (partitioned) node: it rejoins by scale-out.
                for n in idle:
                    self.join(n, self.sched.nodes[n].data_addr, [m for m in (a, b) if m != n],
                              step=self._held_by(n))
            else:
                self.publish_policy(effective_step=self.max_step() + self.lead())
            kind: EventKind = "connect-link"
        else:
            if self._link(a, b) is None:
                return None
            if not failed:  # removed by hand: not restored when an end becomes a member
                self._wants.get(a, set()).discard(b)
                self._wants.get(b, set()).discard(a)
            self._drop_links(a, b)
            if failed:
                self.sched.record("link-failed", node=a, peer=b)
            self.publish_policy(effective_step=0 if failed else self.max_step() + self.lead())
            kind = "disconnect-link"
        self.sched.record(kind, node=a, peer=b, delay_ms=(self.clock.monotonic() - t0) * 1000,
                          policy_version=self.sched.policy_version)
        return None

    def metrics(self, node: str, rep: LinkMetrics) -> None:
        """A probe's measurement of a link; it shows in the next snapshot, and gives a policy
        published before its tree was measured its chunk size (:meth:`_size_chunks`)."""
        lk = self._link(node, rep.peer)
        if lk is None:
            return
        rtt, bw = rep.rtt_ms, rep.bandwidth_mbps
        new = replace(lk, measured_at=self.sched.now_ms(),
                      rtt_ms=measured(rtt) if _finite(rtt) else lk.rtt_ms,
                      bandwidth_mbps=measured(bw) if _finite(bw) else lk.bandwidth_mbps)
        self.sched.links[self.sched.links.index(lk)] = new
        if _finite(bw):  # the tree follows rates only: RTT reports (every few s) change nothing
            key = link_key(lk.a, lk.b)
            self.bw_readings[key] = self.bw_readings.get(key, 0) + 1
            self._improve_policy()

    def _improve_policy(self) -> None:
        """With no join in flight, republish the policy (a planned change, at a step ahead)
        when measurements make it worse than it could be: its chunks are :data:`RECHUNK_GAIN`
        times off the size its measured slowest link calls for (a tree published unmeasured
        has chunks sized by the vector, the largest), or every link is measured
        and the widest tree's slowest link is at least :data:`RETREE_GAIN` times the current
        tree's (margins, so that measurement noise never flips the policy back and forth)."""
        pub = self.sched.policy
        if pub is None or not pub.members or self.joins:
            return
        rates = self._rates()
        now = self._bottleneck(pub.edges, rates)
        if now is not None:
            # 0 (by the vector: unmeasured, or faster than the largest chunk) counts as the max
            want, have = chunk_for_rate(now) or CHUNK_KIB_MAX, pub.chunk_kib or CHUNK_KIB_MAX
            if max(want, have) >= RECHUNK_GAIN * min(want, have):
                log.info("chunks of %d KiB (0: by the vector) for a tree whose slowest link "
                         "is %.0f Mbit/s, not %d", chunk_for_rate(now), now, pub.chunk_kib)
                self.publish_policy(effective_step=self.max_step() + self.lead())
                return
        best = spanning_tree(pub.members, {k: v for k, v in rates.items() if v})
        wider = self._bottleneck(best.edges, rates)
        if (now is not None and wider is not None and best.connected
                and wider >= RETREE_GAIN * now):
            log.info("a wider tree: its slowest link %.0f Mbit/s, the current one's %.0f",
                     wider, now)
            self.publish_policy(effective_step=self.max_step() + self.lead())

    def _rates(self) -> dict[tuple[str, str], float | None]:
        """Every link that is up, with its measured rate (None: not measured yet)."""
        return {link_key(lk.a, lk.b): lk.bandwidth_mbps for lk in self.sched.links
                if lk.state == "up"}

    @staticmethod
    def _bottleneck(edges: Iterable[tuple[str, str]],
                    rates: dict[tuple[str, str], float | None]) -> float | None:
        """The slowest rate of a tree's ``edges``; None while one of them is unmeasured."""
        got = [rates.get(link_key(a, b)) for a, b in edges]
        return None if not got or None in got else min(r for r in got if r is not None)

    def _chunk_kib(self, edges: Iterable[tuple[str, str]]) -> int:
        """The chunk size for a tree of ``edges``: from its slowest measured link, or 0
        while one of them is not measured (:func:`chunk_for_rate`)."""
        slowest = self._bottleneck(edges, self._rates())
        return 0 if not slowest else chunk_for_rate(slowest)

    def handle(self, node: str, body: ClusterRequest) -> str | None:
        """Apply one request from ``node``; returns an error line for the requester."""
        if isinstance(body, JoinRequest):
            self.join(node, body.addr, body.neighbors, body.rtts, body.step)
        elif isinstance(body, LeaveRequest):
            self.leave(node, body.step)
        elif isinstance(body, LinkRequest):
            return self.link(node, body.peer, up=body.action == "add")
        elif isinstance(body, WorkerExit):  # it exited, or it hung and was killed
            if body.reason == "job-failed":  # said once: chaosd does not retry it
                self.sched.record("job-failed", node=node, code=body.code,
                                  detail=body.detail[:300])
            self.gone(node, body.reason)
            if node in self.sched.nodes:  # no worker to rejoin with until it asks again
                self.sched.set_node(node, data_addr="")
        else:
            return self.report(node, body)
        return None

    def report(self, node: str, rep: Report) -> str | None:
        """One report; mypy checks that every kind a node sends has a branch."""
        if isinstance(rep, Replicated):
            self.replicated(node, rep)
        elif isinstance(rep, LinkFailed):
            peer = rep.peer
            if not self.alive(peer):
                # The peer itself is going (its last will is being confirmed): that is
                # a node failure, handled as one, not a cut link or a partition.
                log.info("link %s-%s failed with its peer; awaiting the node failure",
                         node, peer)
                return None
            if node in self.joins or peer in self.joins:
                # A rejoining node's old links (from before it froze or was cut off) break
                # as it comes back, and their reports arrive just after its join made the new
                # ones: cutting those isolated it for good. The link stays; after the join,
                # failures count again. But a source the new node cannot reach serves it no
                # more: with none left, the rounds from its first one waited on it until its
                # join timed out (the soak: 300 s, a partition's loser rejoining from the one
                # member left, over the link that had failed).
                joiner, source = (node, peer) if node in self.joins else (peer, node)
                if source in self.joins[joiner].command.sources:
                    self._source_lost(joiner, source, "its link to the new node failed")
                else:
                    log.info("link %s-%s failed during a join; the fetch plans around it",
                             node, peer)
                return None
            if self._link(node, peer) is None:
                # One we dropped already (its ends learn of it late, after a cut): no news of
                # the peer. Blamed, a member reachable from everyone was scaled in, and a
                # stale state started the cluster over (the simulator's seed 11348).
                return None
            if self._blame(node, peer):
                self.gone(peer, "links-failed")
                return None
            return self.link(node, peer, up=False, failed=True)
        elif isinstance(rep, LinkRecovered):
            if self.alive(rep.peer) and rep.peer in self.sched.nodes:
                return self.link(node, rep.peer, up=True)
        elif isinstance(rep, Stall):
            self.stall(node, rep)
        elif isinstance(rep, LinkMetrics):
            self.metrics(node, rep)
        elif isinstance(rep, ServeDeclined):
            self.serve_declined(node, rep)
        elif isinstance(rep, RoundAborted):
            log.info("round %d aborted on %s: %s", rep.step, node, rep.reason)
        elif isinstance(rep, RoundStuck):
            log.warning("round %d stuck on %s for %.0fs: %s", rep.step, node, rep.waited_s,
                        rep.reason)
            self.sched.record("round-stuck", node=node, step=rep.step,
                              waited_s=round(rep.waited_s, 1), reason=rep.reason[:200])
        elif isinstance(rep, StateDiverged):
            return self.diverged(node, rep)
        elif isinstance(rep, SnapshotFailed):
            log.warning("%s snapshots no more: %s", node, rep.reason)
            self.sched.record("snapshot-failed", node=node, reason=rep.reason[:300])
        elif isinstance(rep, StateRefused):  # its worker exits next, and is not restarted
            log.warning("%s cannot join: %s", node, rep.reason[:300])
        else:
            assert_never(rep)
        return None

    def _blame(self, node: str, peer: str) -> bool:
        """Note that ``node``'s link to ``peer`` failed; whether ``peer``'s worker is the one
        that broke: its links failed from two peers within BLAME_S, and theirs to nobody else.

        One report at a time, each failed link is a partition: when the hub of a star lost its
        worker unnoticed (its owner started another script), each neighbour's report cut that
        neighbour off in turn, and the last tie kept the hub, the scheduler's own node with no
        state left, while the three holders were set aside (the simulator's seed 50). A cut
        between two sites blames nodes on both sides, and is left to the partition rule.
        """
        now = self.clock.monotonic()
        for blamers in self._blamed.values():
            for n in [n for n, at in blamers.items() if now - at > BLAME_S]:
                del blamers[n]
        self._blamed.setdefault(peer, {})[node] = now
        blamers = self._blamed[peer]
        if len(blamers) < 2 or peer not in self.members():
            return False
        if any(set(self._blamed.get(b, {})) - {peer} for b in blamers):
            return False  # a blamer's own links fail too: a cut, not one broken worker
        log.warning("links to %s failed from %s: taking its worker for failed", peer,
                    ", ".join(sorted(blamers)))
        del self._blamed[peer]
        return True

    def diverged(self, node: str, rep: StateDiverged) -> str | None:
        """The divergence guard found ``node``'s state differs from the majority's at a step.

        Recorded as a ``state-diverged`` event, then ``node`` is dropped at once, as for a
        failure (a ``scale-in`` with that reason): the rounds go on without it, and its
        worker, still attached, sees itself outside the policy and rejoins by scale-out,
        which re-replicates the majority's state to it.
        """
        if node not in self.sched.nodes:
            return f"unknown node {node!r}"
        log.warning("%s diverged at step %d: %s, majority %s", node, rep.step, rep.digest,
                    rep.majority)
        self.sched.record("state-diverged", node=node, step=rep.step, digest=rep.digest.lower(),
                          majority=rep.majority.lower())
        self.gone(node, "state-diverged")
        return None

    def serve_declined(self, source: str, rep: ServeDeclined) -> None:
        """A source refused to serve a new node (its memory guard): the new node plans with
        its other sources, and the scale-out event will say who declined and why."""
        why = (rep.reason or "no reason given")[:200]
        log.warning("%s declined to serve %s: %s", source, rep.new, why)
        self._source_lost(rep.new, source, why)

    def _source_lost(self, new: str, source: str, why: str) -> None:
        """``source`` will not serve ``new``'s join (it declined, or ``new`` cannot reach it):
        the new node plans with its other sources, or, with none left, is planned again."""
        join = self.joins.get(new)
        if join is None or source in join.declined:
            return
        join.declined[source] = why
        if join.serving(self._active()):
            return  # the others serve it
        # Every source declined: the new node would retry a pull nobody serves until its own
        # timeout (the simulator's seed 145). Planned again, with members that did not
        # decline if there are any, or else the same ones asked again.
        others = [m for m in self._active() if m != new and m not in join.declined]
        log.warning("no source of %s's join serves it (%s: %s); planning it again", new,
                    source, why)
        # The policy that added it governs the rounds from its first one on, and they would
        # wait for a node that has no state until the new plan's later step, while its new
        # sources wait in them to serve it (the simulator's seed 1063: a deadlock from step
        # 5 on). A policy without it governs at once; the new plan adds it again later.
        del self.joins[new]
        self.sched.set_node(new, state="standby")
        self.publish_policy(effective_step=0)
        self._plan_again(join, others)

    def stall(self, node: str, rep: Stall) -> None:
        """Attach a worker's measured stall to the event of that policy version."""
        events = self.sched.events
        for i in range(len(events) - 1, -1, -1):
            ev: Event = events[i]
            if ev.detail.get("policy_version") == rep.policy_version:
                stall = max(rep.ms, float(ev.detail.get("stall_ms") or 0.0))
                events[i] = replace(ev, detail={**ev.detail, "stall_ms": round(stall, 3)})
                self.sched.dirty = True
                return
