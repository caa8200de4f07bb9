"""Mutants: each puts back one fault the project once had (or that the simulator found), so
that the harness shows it catches it (``chaosctl bench dst --mutant NAME``).

A mutant is the fix undone, written against today's code: the one decision the fix changed,
put back as it was. The simulator must then break an invariant within some seeds; the seeds
pinned in ``tests/dst`` do so for every mutant, and pass without it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from typing import Any

from chaos_bench.dst import worker as sim_worker
from chaos_edge.trainer import scaleout
from daemon.agent.leadership import Leadership
from daemon.agent.node import NodeAgent
from daemon.cluster import primitives
from daemon.cluster.detector import PhiAccrualDetector
from daemon.cluster.election import Election, Heard, Holding, better
from daemon.cluster.role import SchedulerRole
from daemon.contracts.messages import Heartbeat, Request, Status
from daemon.contracts.protocol import Bootstrap, parse_request


@dataclass(frozen=True)
class Mutant:
    """One fault put back."""

    name: str
    fixed_in: str  # the commit whose fix this undoes
    what: str
    patches: Callable[[], list[tuple[Any, str, Any]]]  # (owner, attribute, the old value)


@contextlib.contextmanager
def applied(name: str | None) -> Iterator[None]:
    """Run the code inside with mutant ``name`` in place (None: as it is)."""
    if name is None:
        yield
        return
    patches = MUTANTS[name].patches()
    saved = [(owner, attr, owner.__dict__[attr]) for owner, attr, _ in patches]
    try:
        for owner, attr, value in patches:
            setattr(owner, attr, value)
        yield
    finally:
        for owner, attr, value in saved:
            setattr(owner, attr, value)


# --- this findings (by the simulator) -----------------------------------------------------
def _deaf_judges() -> list[tuple[Any, str, Any]]:
    def hears_itself(self: NodeAgent, now: float) -> bool:
        return True
    # The silence horizon (a1a7607) guards the same thing from the other side: both go. So
    # does the view of the claim a scheduler yields to (stop 59), which masks it at seed 310
    # (none of 0-599 at 30 s caught it with that fix in place).
    return [(NodeAgent, "_hears_itself", hears_itself), *_judged_to_now(),
            *_yielded_view_dropped()]


def _judged_to_now() -> list[tuple[Any, str, Any]]:
    phi = PhiAccrualDetector.__dict__["phi"]

    def to_now(self: PhiAccrualDetector, node: str, until: float | None = None) -> float:
        return phi(self, node)  # a peer's silence counted up to now, whatever we heard
    return [(PhiAccrualDetector, "phi", to_now)]


def _snapshot_step() -> list[tuple[Any, str, Any]]:
    def nothing_heard(self: NodeAgent) -> dict[str, int]:
        return {}  # a new scheduler resumes at the snapshot's step alone
    return [(NodeAgent, "heard_steps", nothing_heard)]


def _contest_acts() -> list[tuple[Any, str, Any]]:
    def on_request(self: NodeAgent, req: Request) -> None:  # as before: no holding back
        if self.role is not None:
            body = parse_request(req.op, req.args)
            self.counters["requests"] += 1
            if req.node != self.me:
                self.detector.heartbeat(req.node, seed=True)
            self.role.on_request(req, body)
    return [(NodeAgent, "_on_request", on_request)]


def _keep_joiners() -> list[tuple[Any, str, Any]]:
    def keep(self: primitives.Negotiator, parts: tuple[frozenset[str], ...]) -> frozenset[str]:
        return min(parts, key=lambda p: (-sum(map(self.alive, p)), -len(p),
                                         self.sched.me not in p, min(p)))
    return [(primitives.Negotiator, "_keep", keep)]


def _no_hold() -> list[tuple[Any, str, Any]]:
    return [(primitives, "HOLD_S", 0.0)]


def _no_heal() -> list[tuple[Any, str, Any]]:
    def heal(self: primitives.Negotiator) -> None:
        return None
    return [(primitives.Negotiator, "_heal_overlay", heal)]


def _silent_empty() -> list[tuple[Any, str, Any]]:
    publish = primitives.Negotiator.__dict__["_publish"]

    def old(self: primitives.Negotiator, effective_step: int, exclude: Any) -> Any:
        before = (self.sched.policy_version, self.sched.policy)
        got = publish(self, effective_step, exclude)
        if got is not None and not got.members:  # say nothing when no member is left
            self.sched.policies.pop()
            self.sched.policy_version = before[0]
            self.sched.policy = None
            return None
        return got
    return [(primitives.Negotiator, "_publish", old)]


def _newcomer_stands() -> list[tuple[Any, str, Any]]:
    tick = Election.__dict__["tick"]

    def old(self: Election, live: set[str], holding: Holding = Holding.VIEW, own: int = 0,
            cluster_term: int = 0, **later: Any) -> Any:
        return tick(self, live, holding, own, 0, **later)  # blind to the peers' term
    return [(Election, "tick", old)]


def _one_report_partitions() -> list[tuple[Any, str, Any]]:
    def never(self: primitives.Negotiator, node: str, peer: str) -> bool:
        return False  # each failed link is a partition of its own, whoever reported it
    return [(primitives.Negotiator, "_blame", never)]


def _presence_unacted() -> list[tuple[Any, str, Any]]:
    def restarts_only(self: SchedulerRole, statuses: list[Status]) -> None:
        for st in statuses:  # a member whose daemon left is marked so, with no policy
            if self.sched.observe_status(st) == "restarted":
                self.on_status(st)
    return [(SchedulerRole, "take_presence", restarts_only)]


def _leave_drops_state() -> list[tuple[Any, str, Any]]:
    def never(self: primitives.Negotiator, node: str) -> bool:
        return False  # the last member leaves at once, even while it serves a join
    return [(primitives.Negotiator, "_serves_last", never)]


def _extrapolated_hold() -> list[tuple[Any, str, Any]]:
    init = primitives.Negotiator.__dict__["__init__"]

    def extrapolating(self: primitives.Negotiator, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        self.reported = self.step_of  # a join holds the step extrapolated at the old rate
    return [(primitives.Negotiator, "__init__", extrapolating)]


def _unchallenged() -> list[tuple[Any, str, Any]]:
    return [(Election, "challenged", property(lambda self: False))]


class _KnowsNothing(dict[str, "int | None"]):
    """Every node's holding known, and none holding: nobody is waited for or counted."""

    def __contains__(self, key: object) -> bool:
        return True

    def get(self, key: str, default: Any = None) -> Any:
        return None

    def __getitem__(self, key: str) -> None:
        return None


def _unheard_bootstrap() -> list[tuple[Any, str, Any]]:
    init = primitives.Negotiator.__dict__["__init__"]

    def blind(self: primitives.Negotiator, *args: Any, **kw: Any) -> None:
        init(self, *args, **kw)
        self._holds = _KnowsNothing()  # with no member, only joiners' states count
    return [(primitives.Negotiator, "__init__", blind)]


# --- the last four join faults (issue 20) ---------------------------------------------------
def _tie_lower_id() -> list[tuple[Any, str, Any]]:
    def keep(self: primitives.Negotiator, parts: tuple[frozenset[str], ...]) -> frozenset[str]:
        return min(parts, key=lambda p: (-len(p), min(p)))  # size, then the lower id
    return [(primitives.Negotiator, "_keep", keep)]


def _own_restart_kept() -> list[tuple[Any, str, Any]]:
    def kept(self: SchedulerRole, st: Status) -> None:
        self.sched.observe_status(st)  # the verdict on our own box, ignored
    return [(SchedulerRole, "take_own", kept)]


def _member_floor() -> list[tuple[Any, str, Any]]:
    def max_step(self: primitives.Negotiator) -> int:
        return max((self.step_of(n) for n in self.members()), default=0)
    return [(primitives.Negotiator, "max_step", max_step)]


def _stale_active_done() -> list[tuple[Any, str, Any]]:
    observe = primitives.Negotiator.__dict__["observe_worker"]

    def done_on_any_active(self: primitives.Negotiator, node: str, state: str, step: int,
                           attached: bool = True, snapshot: int = -1,
                           policy_version: int | None = None) -> None:
        join = self.joins.get(node)
        if join is None or state != "active":
            observe(self, node, state, step, attached, snapshot, policy_version)
            return
        # The fix undone: an "active" heartbeat ends the join, whatever its step (and the
        # policy its rounds were under, a later guard that sees the same thawed member).
        saved = join.command
        join.command = replace(saved, version_step=min(saved.version_step, step))
        try:
            observe(self, node, state, step, attached, snapshot, None)
        finally:
            join.command = saved
    return [(primitives.Negotiator, "observe_worker", done_on_any_active)]


def _old_policy_done() -> list[tuple[Any, str, Any]]:
    observe = primitives.Negotiator.__dict__["observe_worker"]

    def any_policy(self: primitives.Negotiator, node: str, state: str, step: int,
                   attached: bool = True, snapshot: int = -1,
                   policy_version: int | None = None) -> None:
        # The fix undone: the policy the joiner's rounds were committed under is not asked.
        observe(self, node, state, step, attached, snapshot, None)
    return [(primitives.Negotiator, "observe_worker", any_policy)]


def _own_disk_unread() -> list[tuple[Any, str, Any]]:
    def unread(self: SchedulerRole, hb: Heartbeat) -> None:
        return None  # the fix undone: our own box is known when its heartbeat's echo comes
    return [(SchedulerRole, "take_own_heartbeat", unread)]


def _ahead_of_members_only() -> list[tuple[Any, str, Any]]:
    def ahead(self: primitives.Negotiator, node: str, step: int) -> bool:
        return True  # the fix undone: a joiner ahead of the members ignores the nodes up
    return [(primitives.Negotiator, "_ahead_of_nodes_up", ahead)]


def _disk_blind_start() -> list[tuple[Any, str, Any]]:
    def no_disks(self: primitives.Negotiator, up: list[str]) -> list[int]:
        return []  # the fix undone: a newer snapshot on a disk up does not hold a start
    return [(primitives.Negotiator, "_disks_up", no_disks)]


def _stale_replicate() -> list[tuple[Any, str, Any]]:
    return [(scaleout.JoinMachine, "superseded", property(lambda self: False))]


def _inferred_bootstrap() -> list[tuple[Any, str, Any]]:
    cmd = primitives.Negotiator.__dict__["_cmd"]
    advance = scaleout.JoinMachine.__dict__["advance"]

    def no_bootstrap(self: primitives.Negotiator, node: str, body: Any) -> None:
        if not isinstance(body, Bootstrap):  # the first node is not told to start alone
            cmd(self, node, body)

    def infer(self: scaleout.JoinMachine, now: float, newest: Any, in_touch: bool = True,
              term: int = 0) -> Any:
        # ... it infers it from the newest policy naming it alone, as it used to.
        if (self.phase is scaleout.JoinPhase.WAITING and self._newest is None
                and self.command is None and newest is not None
                and newest.members == (self.me,)):
            self._newest = Bootstrap(new=self.me, policy_version=newest.version)
        return advance(self, now, newest, in_touch, term)
    return [(primitives.Negotiator, "_cmd", no_bootstrap),
            (scaleout.JoinMachine, "advance", infer)]


def _lost_replicate() -> list[tuple[Any, str, Any]]:
    join = primitives.Negotiator.__dict__["join"]

    def ignore_repeats(self: primitives.Negotiator, node: str, *args: Any, **kw: Any) -> None:
        if node in self.joins and self.sched.nodes[node].state == "joining":
            return  # a repeated join request is not answered again
        join(self, node, *args, **kw)

    # The worker judged its standing by the newest policy, not its next round's.
    def by_newest(self: Any) -> None:
        book = self.book
        nxt = book.for_round(self.state.step + 1)
        newest = book.newest
        if (nxt is not None and newest is not None and self.me not in nxt.members
                and self.me in newest.members):
            self._round_since = self._round_since or self.sim.now
            return  # it sees itself in the newest policy and waits for a round with it
        training(self)

    training = sim_worker.SimWorker.__dict__["_training"]
    return [(primitives.Negotiator, "join", ignore_repeats),
            (sim_worker.SimWorker, "_training", by_newest)]


# --- a stale scheduler's contest (seed 1127) -------------------------------------------------
def _claim_weighed() -> list[tuple[Any, str, Any]]:
    def on_its_word(self: Leadership, leader: str, live: set[str] | None = None) -> Heard:
        return Heard()  # the rival weighed on its claim alone; every peer taken for heard
    return [(Leadership, "rival", on_its_word)]


# --- a rejoin held up by its own policy (seed 1721) ------------------------------------------
def _joiners_added_at_last() -> list[tuple[Any, str, Any]]:
    def one_step(self: primitives.Negotiator, effective_step: int) -> Any:
        early = [n for n, j in self.joins.items()
                 if n in self.sched.nodes and self.sched.nodes[n].state == "joining"
                 and j.member_from > effective_step]
        if not early:
            return self._publish(effective_step, exclude=())
        self._publish(effective_step, exclude=early)  # every joiner added at the last step
        return self._publish(max(self.joins[n].member_from for n in early), exclude=())
    return [(primitives.Negotiator, "publish_policy", one_step)]


def _rejoin_named() -> list[tuple[Any, str, Any]]:
    def never(self: primitives.Negotiator, node: str) -> bool:
        return False  # the fix undone: the join's policy takes effect at its own step only
    return [(primitives.Negotiator, "_named", never)]


def _last_policy_named() -> list[tuple[Any, str, Any]]:
    def last(self: primitives.Negotiator, node: str, since: int, policy: Any) -> Any:
        return policy  # the fix undone: the newest policy published, whoever it adds
    return [(primitives.Negotiator, "_adding", last)]


def _source_link_ignored() -> list[tuple[Any, str, Any]]:
    report = primitives.Negotiator.__dict__["report"]

    def ignore(self: primitives.Negotiator, node: str, rep: Any) -> str | None:
        from daemon.contracts.protocol import LinkFailed
        if isinstance(rep, LinkFailed) and (node in self.joins or rep.peer in self.joins) \
                and self.alive(rep.peer):
            return None  # the fix undone: a failed link during a join is left to the fetch
        return report(self, node, rep)
    return [(primitives.Negotiator, "report", ignore)]


def _stale_bootstrap() -> list[tuple[Any, str, Any]]:
    advance = scaleout.JoinMachine.__dict__["advance"]

    def never_stale(self: Bootstrap, newest_version: int, newest_members: Any) -> bool:
        return False  # the fix undone: any bootstrap queued is carried out

    def blind(self: scaleout.JoinMachine, now: float, newest: Any, in_touch: bool = True,
              term: int = 0) -> Any:
        return advance(self, now, newest, True, term)  # ... at once, in touch or not
    return [(Bootstrap, "stale", never_stale), (scaleout.JoinMachine, "advance", blind)]


def _first_holds() -> list[tuple[Any, str, Any]]:
    join = primitives.Negotiator.__dict__["join"]

    def first(self: primitives.Negotiator, node: str, *args: Any, **kw: Any) -> None:
        pending = self.joins.get(node)
        if pending is not None and self.sched.nodes[node].state == "joining":
            self._send_replicate(pending)  # the fix undone: the repeat's step is not taken
            return
        join(self, node, *args, **kw)

    def plan_again(self: primitives.Negotiator, j: primitives.Join, wanted: list[str]) -> None:
        if self.joins.get(j.node) is j:
            del self.joins[j.node]
            self.sched.set_node(j.node, state="standby")
        self.join(j.node, self.sched.nodes[j.node].data_addr, wanted, step=j.holds)
    return [(primitives.Negotiator, "join", first),
            (primitives.Negotiator, "_plan_again", plan_again)]


def _held_named() -> list[tuple[Any, str, Any]]:
    unname = primitives.Negotiator.__dict__["_unname"]

    def keep(self: primitives.Negotiator, node: str) -> None:
        if self.sched.policy is None:  # a later fix's case, kept: no policy names it
            unname(self, node)
        return None  # the fix undone: a held node stays in the policy in force
    return [(primitives.Negotiator, "_unname", keep)]


def _viewless_unasked() -> list[tuple[Any, str, Any]]:
    def named_only(self: primitives.Negotiator, node: str) -> None:
        if self._named(node):  # the fix undone: with no policy of ours, nothing is said
            self.publish_policy(effective_step=0)
    return [(primitives.Negotiator, "_unname", named_only)]


def _silent_unawaited() -> list[tuple[Any, str, Any]]:
    join = primitives.Negotiator.__dict__["join"]

    def forget(self: primitives.Negotiator, node: str, *args: Any, **kw: Any) -> None:
        self._silenced.clear()  # the fix undone: a member gone silent is waited for by no one
        join(self, node, *args, **kw)
    return [(primitives.Negotiator, "join", forget)]


def _behind_train_on() -> list[tuple[Any, str, Any]]:
    def never(self: primitives.Negotiator) -> bool:
        return False  # the fix undone: members left behind the state that went train on
    return [(primitives.Negotiator, "_left_behind", never)]


def _paused_view_kept() -> list[tuple[Any, str, Any]]:
    def trust(self: primitives.Negotiator) -> None:
        return None  # the fix undone: elected on a view from before our pause, we train on
    return [(primitives.Negotiator, "doubt_own", trust)]


def _acts_after_cut() -> list[tuple[Any, str, Any]]:
    def at_once(self: NodeAgent) -> None:
        return None  # the fix undone: a scheduler back from a long cut acts at once
    return [(NodeAgent, "_hold_after_cut", at_once)]


def _ahead_plus_lead() -> list[tuple[Any, str, Any]]:
    def old(self: primitives.Negotiator, step: int) -> bool:
        # the fix undone: ahead of the newest step heard plus the lead, joiners counted
        return step > max(self.sched.step, self.max_step()) + self.lead()
    return [(primitives.Negotiator, "_clearly_ahead", old)]


def _daemon_step_held() -> list[tuple[Any, str, Any]]:
    def said(self: primitives.Negotiator, node: str) -> int:
        return self.reported(node)  # the fix undone: the daemon's step, not its worker's
    return [(primitives.Negotiator, "_held_by", said)]


def _ended_bootstrap() -> list[tuple[Any, str, Any]]:
    def never(self: Bootstrap, term: int) -> bool:
        return False  # the fix undone: a bootstrap of an ended term is carried out
    return [(Bootstrap, "ended", never)]


def _older_plan_joins() -> list[tuple[Any, str, Any]]:
    def no(*_: object) -> bool:
        return False  # the fix undone: any report ends the join, any newer policy admits
    return [(primitives.Negotiator, "_older_plan", staticmethod(no)),
            (scaleout.JoinMachine, "_replanned", no)]


def _aside_unplanned() -> list[tuple[Any, str, Any]]:
    stand = primitives.Negotiator.__dict__["stand_aside"]

    def old(self: primitives.Negotiator, node: str, why: str) -> Any:
        policy = stand(self, node, why)
        self._leaving.pop(node, None)  # the fix undone: its rounds until then are not awaited
        return policy
    return [(primitives.Negotiator, "stand_aside", old)]


def _leaver_unrecalled() -> list[tuple[Any, str, Any]]:
    def never(self: primitives.Negotiator, newer_than: int = -1) -> bool:
        # The fix undone: a leaver whose leave is not in effect goes all the same when the
        # last member goes. Stop 59's recall by a joiner that finds no member masks it at its
        # seed (5955's restarted worker asks with its 60 beside the leaver's 71): both go.
        return False
    return [(primitives.Negotiator, "_recall_leaver", never)]


def _leaver_unrecalled_by_joiner() -> list[tuple[Any, str, Any]]:
    recall = primitives.Negotiator.__dict__["_recall_leaver"]

    def not_for_joiners(self: primitives.Negotiator, newer_than: int = -1) -> bool:
        # the fix undone: a joiner that finds no member starts over beside a leaver's newer state
        return False if newer_than >= 0 else recall(self, newer_than)
    return [(primitives.Negotiator, "_recall_leaver", not_for_joiners)]


def _older_view_taken() -> list[tuple[Any, str, Any]]:
    def old(self: Leadership, claim: tuple[int, str]) -> bool:
        # the fix undone: with no leader known, any snapshot is taken, an older term's too
        election = self._a.election
        return election.leader is not None and better(
            (election.term, election.leader), claim)
    # Stop 59's keeping of the view of a claim yielded to masks it at its seed: both go.
    return [(Leadership, "stale", old), *_yielded_view_dropped()]


def _disk_unweighed() -> list[tuple[Any, str, Any]]:
    def worker_only(hb: Heartbeat) -> int:
        return hb.holds  # the fix undone: a snapshot on a peer's disk counts for nothing
    return [(Leadership, "holds", staticmethod(worker_only))]


def _yielded_view_dropped() -> list[tuple[Any, str, Any]]:
    on_state = Leadership.__dict__["on_state"]

    def old(self: Leadership, st: Any) -> None:
        on_state(self, st)
        if self._a.role is not None:
            self._held_state = None  # the fix undone: a better claim's snapshot is dropped
    return [(Leadership, "on_state", old)]


def _election_waits() -> list[tuple[Any, str, Any]]:
    def waits(self: SchedulerRole) -> None:
        pass  # the fix undone: the policy inherited governs until this term's first change
    return [(SchedulerRole, "govern_at_once", waits)]


MUTANTS: dict[str, Mutant] = {m.name: m for m in (
    Mutant("deaf-judges", "b03bf86", "a node judges its peers while its own heartbeats no "
           "longer come back from the broker", _deaf_judges),
    Mutant("contest-acts", "44a46a7", "a scheduler acts on requests while its seat is "
           "contested", _contest_acts),
    # These three lose the state the way the silent wait (014ad8e) also guards against: a
    # joiner starting over beside a holder not heard yet. That wait masks each at its seed, so
    # each takes it away too, as deaf-judges takes both guards against a deaf judge. So does
    # the election-time read of our own box (own-disk-unread): the holder not heard at seeds
    # 98 and 164 is the new scheduler's own worker.
    Mutant("keep-joiners", "7101caa", "the partition rule keeps a part of joiners over one "
           "holding the state (and no silent member nor our own box is waited for)",
           lambda: [*_keep_joiners(), *_silent_unawaited(), *_own_disk_unread()]),
    Mutant("no-hold", "510fffc", "with no member left, any joiner starts the cluster over at "
           "once", _no_hold),
    Mutant("no-heal", "36028e4", "the overlay is not healed when a member goes", _no_heal),
    Mutant("silent-empty", "1bde3aa", "no policy says the last member went", _silent_empty),
    Mutant("newcomer-stands", "db854d8", "a node that knows no cluster stands at once beside "
           "peers that do", _newcomer_stands),
    Mutant("judged-to-now", "a1a7607", "a peer's silence is judged up to now, not up to our "
           "own heartbeat's last return", _judged_to_now),
    Mutant("snapshot-step", "25fb32c", "a new scheduler resumes at its snapshot's step, "
           "behind what its members last said", _snapshot_step),
    Mutant("one-report-partitions", "1887adf", "links failing to one member from "
           "several peers partition the overlay one report at a time (and no silent member "
           "is waited for)", lambda: [*_one_report_partitions(), *_silent_unawaited()]),
    Mutant("unchallenged", "e1516ae", "the newer term trains on while a scheduler back "
           "from a cut contests it", _unchallenged),
    Mutant("last-leave-lost", "164cf3b", "a new scheduler marks a member whose daemon left "
           "before its election as left, with no policy, and the last member leaves at once "
           "while it is the source of a join (seed 319 needed both; our own box is not read at "
           "election, nor a leaver recalled when the member it left goes)",
           lambda: [*_presence_unacted(), *_leave_drops_state(), *_own_disk_unread(),
                    *_leaver_unrecalled()]),
    Mutant("extrapolated-hold", "5e2e34c", "a partitioned node linked back holds its step "
           "extrapolated at its old rate, not the one it said", _extrapolated_hold),
    Mutant("unheard-bootstrap", "31c57f8", "with no member, a joiner starts the cluster over "
           "before the nodes up are heard, and a newer state their workers hold does not "
           "count", _unheard_bootstrap),
    Mutant("tie-lower-id", "dbc3381", "a tied partition keeps the lower id, not the "
           "scheduler's own part (and no silent member nor our own box is waited for)",
           lambda: [*_tie_lower_id(), *_silent_unawaited(), *_own_disk_unread()]),
    Mutant("stale-replicate", "7b9202f", "a joiner keeps waiting on a replicate command a "
           "newer one replaced", _stale_replicate),
    Mutant("inferred-bootstrap", "630920a", "the first node infers its bootstrap from a policy "
           "naming it alone", _inferred_bootstrap),
    Mutant("own-restart-kept", "98ac52f", "a scheduler back as a new process keeps its own "
           "box's old membership", _own_restart_kept),
    Mutant("member-floor", "934c8a2", "a member just bootstrapped counts at the step its "
           "daemon last said (0), not the step it became one at", _member_floor),
    Mutant("stale-active-done", "5acf90d", "a joiner heard active behind its replica's "
           "step is taken to have finished its join", _stale_active_done),
    Mutant("ahead-of-members-only", "c6f1fe5", "a joiner ahead of every member starts the "
           "cluster over though a node up holds a newer state", _ahead_of_members_only),
    Mutant("disk-blind-start", "7153b03", "the first box to ask after a power cut starts "
           "over though a box up has a newer snapshot on its disk", _disk_blind_start),
    Mutant("lost-replicate", "072bd3a", "a repeated join request is not answered again, and a "
           "node in the newest policy waits for rounds it is not in", _lost_replicate),
    Mutant("claim-weighed", "92cdf78", "a scheduler contesting a newer term weighs the rival on "
           "its claim alone, and wins before it has heard every live peer", _claim_weighed),
    Mutant("joiners-added-at-last", "e4e2e46", "a policy that holds back several joiners adds "
           "them all at the last one's step, dropping one named from an earlier round",
           _joiners_added_at_last),
    Mutant("rejoin-named", "e4e2e46", "a node that asks to join again stays named in the policy "
           "in force until its new replica's step", _rejoin_named),
    Mutant("source-link-ignored", "2770d4b", "a joiner's failed link to its only source is left to "
           "its fetch, and the rounds wait on it until its join times out",
           _source_link_ignored),
    Mutant("stale-bootstrap", "e032c64", "a bootstrap queued on a frozen box is carried out "
           "when it thaws, though a newer policy has left it out", _stale_bootstrap),
    Mutant("first-holds", "e032c64", "a join keeps the step of its first request, not the "
           "replica its worker restored since, when it is planned again", _first_holds),
    Mutant("held-named", "e032c64", "a joiner held back stays in the inherited policy that "
           "names it, and trains alone on it", _held_named),
    Mutant("viewless-unasked", "29f4a9a", "a scheduler elected without the view holds a "
           "joiner back for workers that train under a policy it never saw, and never asks "
           "them to join", _viewless_unasked),
    Mutant("silent-unawaited", "014ad8e", "a joiner with no member left starts the cluster over "
           "at once, though the last member went silent a moment ago and may be back with "
           "steps we never heard of", _silent_unawaited),
    Mutant("behind-train-on", "f61fc3d", "the members a failure leaves, clearly behind the "
           "state of the nodes that went, train on from their older state", _behind_train_on),
    Mutant("acts-after-cut", "f61fc3d", "a scheduler back from a long cut acts at once on what "
           "it heard before, not after it has heard the nodes it schedules", _acts_after_cut),
    Mutant("ahead-plus-lead", "6ea94ef", "a joiner must be ahead of the newest step heard plus "
           "the lead, with joiners counted as members, to be where the cluster goes on from",
           _ahead_plus_lead),
    Mutant("daemon-step-held", "6ea94ef", "a node linked back rejoins holding its daemon's "
           "step, not what its worker restored", _daemon_step_held),
    Mutant("ended-bootstrap", "335c9d8", "a bootstrap of a scheduler whose term has ended is "
           "carried out", _ended_bootstrap),
    Mutant("last-policy-named", "1c36e36", "a joiner's command names the last policy published "
           "with it, not the one that makes it a member, and its sources serve it too late",
           _last_policy_named),
    Mutant("older-plan-joins", "d78989a", "a joiner's report of an older plan's state ends the "
           "join, and a policy of a newer plan admits a joiner holding the older state",
           _older_plan_joins),
    Mutant("old-policy-done", "2a56fa0", "a joiner heard active past its replica's step, under "
           "a policy older than the one adding it, is taken to have finished its join",
           _old_policy_done),
    Mutant("own-disk-unread", "2a56fa0", "a new scheduler knows its own worker and disk only "
           "when its heartbeat's echo comes back through the broker", _own_disk_unread),
    Mutant("paused-view-kept", "18b8d69", "a scheduler elected on a view from before its "
           "daemon's pause has its own member train on from it, though the others may have "
           "set it aside meanwhile", _paused_view_kept),
    Mutant("aside-unplanned", "stop 58", "a straggler that fails between its set-aside and the "
           "step it takes effect at is failed as a standby, and the rounds until then wait "
           "for it for good", _aside_unplanned),
    Mutant("leaver-unrecalled", "stop 58", "the last member goes while a leave has not taken "
           "effect, and the leaver's worker, the last holder of the state, leaves all the same",
           _leaver_unrecalled),
    Mutant("older-view-taken", "dc58dae", "a node that knows no leader yet (rebooted) takes a "
           "snapshot of an older term than its own, published by a scheduler that thawed",
           _older_view_taken),
    Mutant("joiner-unrecalling", "f7bdb69", "a joiner that finds no member starts the cluster "
           "over from its state while the last member's leave, taken a moment before, has not "
           "taken effect and its worker holds a newer one", _leaver_unrecalled_by_joiner),
    Mutant("disk-unweighed", "07c3fde", "a scheduler contesting a newer term counts a peer "
           "whose worker has not started yet as holding nothing, though its disk holds a newer "
           "snapshot", _disk_unweighed),
    Mutant("yielded-view-dropped", "07c3fde", "a scheduler drops the snapshot of the better "
           "claim it then steps down to, and is later elected on its own older view",
           _yielded_view_dropped),
    Mutant("election-waits", "stop 61", "a new scheduler goes on under the policy it "
           "inherited, while a policy its cut-off predecessor published after its view reached "
           "only some of the members", _election_waits),
)}
