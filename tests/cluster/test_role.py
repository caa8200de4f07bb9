"""The scheduler role hosted on a fake node: requests in, term-stamped commands out.

The host is the :class:`~daemon.cluster.role.RoleHost` protocol filled in by hand, with the
real election and phi-accrual detector on a fake clock, and a list where the node agent would
queue MQTT messages. Nothing here does I/O or sleeps.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from daemon.cluster.detector import PhiAccrualDetector
from daemon.cluster.election import Action, Election
from daemon.cluster.role import SchedulerRole
from daemon.contracts.clock import Clock, FakeClock
from daemon.contracts.config import Config
from daemon.contracts.errors import MessageError
from daemon.contracts.kinds import WORKER_REPORT_KINDS
from daemon.contracts.messages import (
    ClusterState,
    Command,
    Heartbeat,
    Request,
    Status,
    Topics,
    decode,
)
from daemon.contracts.policy import TERM_POLICY_SPAN, SyncPolicy
from daemon.contracts.protocol import parse_request

pytestmark = pytest.mark.timeout(10)
ME = "s"


@dataclass(frozen=True)
class Queued:
    topic: str
    payload: bytes
    qos: int
    retain: bool


class FakeHost:
    """Everything :class:`SchedulerRole` asks of its node, and nothing more."""

    def __init__(self, clock: FakeClock, view: ClusterState | None = None) -> None:
        self.me = ME
        self.cfg = Config(node_id=ME, cluster="t")
        self.clock: Clock = clock  # the protocol's type: the attribute is read and written
        self.time = clock  # the same clock, which the test moves
        self.topics = Topics("t")
        self.election = Election(ME, self.cfg.election, clock)
        self.detector = PhiAccrualDetector(self.cfg.detector, clock)
        self.view = view
        self.presence: dict[str, Status] = {}
        self.steps: dict[str, int] = {}
        self.heard: dict[str, float] = {}
        self.down: set[str] = set()
        self.queued: list[Queued] = []
        self.incarnation = 1
        self.paused_since_view = False
        self.disk = -1  # the newest snapshot on our own disk (-1: none)
        self.worker_holds = -1  # what our own worker holds (-1: none attached)

    def own_status(self) -> Status:
        return Status(node=ME, online=True, reason="up", incarnation=self.incarnation,
                      addr="10.0.0.1")

    def own_heartbeat(self) -> Heartbeat:
        return Heartbeat(node=ME, seq=1, incarnation=self.incarnation, step=0,
                         state="standby", cpu_percent=0.0, mem_percent=0.0,
                         snapshot=self.disk, holds=self.worker_holds)

    def step_of(self, node: str) -> int:
        return self.steps.get(node, 0)

    def reported_step(self, node: str) -> int:
        return self.steps.get(node, 0)

    def heard_steps(self) -> dict[str, int]:
        return dict(self.steps)

    def view_outdated(self) -> bool:
        return self.paused_since_view

    def daemon_alive(self, node: str) -> bool:
        return node not in self.down

    def silence(self, node: str) -> float | None:
        heard = self.heard.get(node)
        return None if heard is None else self.clock.monotonic() - heard

    def queue(self, topic: str, payload: bytes, qos: int = 1, retain: bool = False) -> None:
        self.queued.append(Queued(topic, payload, qos, retain))

    # --- test helpers ---------------------------------------------------------------------
    def elect(self) -> SchedulerRole:
        self.election.connected()
        self.time.advance(self.cfg.election.grace_s)
        assert self.election.tick(set()).action is Action.CLAIM
        return SchedulerRole(self, None)

    def beat(self, role: SchedulerRole, node: str) -> None:
        """What the agent does with a heartbeat: detector, last heard, then the role."""
        self.detector.heartbeat(node)
        self.heard[node] = self.clock.monotonic()
        hb = Heartbeat(node=node, seq=1, incarnation=1, step=self.steps.get(node, 0),
                       state="active", cpu_percent=0.0, mem_percent=0.0)
        role.on_heartbeat(hb, f"10.0.0.{node}")

    def live(self) -> set[str]:
        return {n for n in self.detector.known() if self.detector.is_alive(n)}

    def commands(self, op: str | None = None) -> list[tuple[str, Command]]:
        """(addressee, command) for every command queued so far, oldest first."""
        out = []
        for q in self.queued:
            parts = q.topic.split("/")
            if parts[-1] != "cmd":
                continue
            cmd = decode(q.payload, Command)
            assert isinstance(cmd, Command)
            if op is None or cmd.op == op:
                out.append((parts[-2], cmd))
        return out

    def reply_to(self, req_id: str) -> Command:
        (reply,) = [c for _, c in self.commands("reply") if c.args["req_id"] == req_id]
        return reply


_seq = 0


def request(role: SchedulerRole, node: str, op: str, **args: Any) -> str:
    global _seq
    _seq += 1
    req_id = f"{node}-{_seq}"
    req = Request(node=node, req_id=req_id, op=op, args=args, reply=True)
    try:  # as the agent does: parsed once, a malformed one refused with its reason
        body = parse_request(op, args)
    except MessageError as exc:
        role.refuse(req, str(exc))
        return req_id
    role.on_request(req, body)
    return req_id


def join(host: FakeHost, role: SchedulerRole, *nodes: str, replicate: bool = True) -> None:
    for node in nodes:
        st = Status(node=node, online=True, reason="up", incarnation=1, addr=f"10.0.0.{node}")
        host.presence[node] = st
        role.on_status(st)
        host.beat(role, node)
        rid = request(role, node, "join", addr=f"10.0.0.{node}:7000", neighbors=[])
        assert host.reply_to(rid).args["error"] is None
        if replicate:
            request(role, node, "report", kind="replicated", version=3, bytes=64)


def successor(*members: str) -> tuple[FakeHost, ClusterState]:
    """A first scheduler admits ``members`` and publishes its snapshot; the host of the next
    one follows it (its view and term), not yet elected."""
    clock = FakeClock()
    first = FakeHost(clock)
    old = first.elect()
    join(first, old, *members)
    snap = old.snapshot()
    host = FakeHost(clock, view=snap)
    host.election.term = snap.term  # it followed the old scheduler
    return host, snap


def kinds(role: SchedulerRole) -> list[str]:
    return [e.kind for e in role.sched.events]


def test_a_new_role_records_its_election_and_admits_who_is_present() -> None:
    host = FakeHost(FakeClock())
    host.presence["b"] = Status(node="b", online=True, reason="up", incarnation=3, addr="x")
    host.heard["old"] = host.clock.monotonic()
    host.election.connected()
    host.time.advance(2.5)
    host.election.tick(set())
    role = SchedulerRole(host, "old")
    assert role.term == 1 and role.sched.term == 1
    ev = role.sched.events[-1]
    assert ev.kind == "scheduler-elected" and ev.node == ME and ev.term == 1
    assert ev.detail["previous"] == "old" and ev.delay_ms == pytest.approx(2500.0)
    assert sorted(role.sched.nodes) == ["b", ME]
    assert role.sched.nodes["b"].state == "standby" and role.sched.nodes["b"].incarnation == 3
    assert not host.queued  # the agent, not the role, publishes the claim


def test_a_new_role_resumes_from_the_retained_snapshot() -> None:
    host, snap = successor("b", "c")
    role = host.elect()
    assert role.term == 2
    assert role.sched.nodes["c"].state == "active"
    assert role.sched.events[-1].detail["term_previous"] == 1
    # It governs at once under the policy in force, renumbered from its own term's floor,
    # above every earlier term's (govern_at_once).
    floor = (role.term - 1) * TERM_POLICY_SPAN
    ours = role.sched.policy
    assert ours is not None and ours.version == floor + 1 > snap.policy_version
    inherited = {k: v for k, v in snap.policy.items() if k not in ("version", "effective_step")}
    assert {k: v for k, v in ours.to_dict().items()
            if k not in ("version", "effective_step")} == inherited
    assert ours.effective_step == 0
    join(host, role, "d")
    assert role.sched.policy.version == floor + 2
    assert role.sched.policy.members == ("b", "c", "d")


def test_a_new_role_publishes_a_policy_of_its_term_effective_at_once() -> None:
    """The old term's scheduler, cut off, may have published a policy that only some members
    got; a round under two versions never commits. The new term's own policy, effective at
    once, replaces it on every member (the simulator's seed 11774, fault 36)."""
    host, snap = successor("b", "c")
    role = host.elect()
    stray = snap.policy_version + 1  # what the cut-off scheduler may have sent after its view
    assert role.sched.dirty  # the agent publishes the snapshot that carries it
    state = role.snapshot()
    newest = SyncPolicy.from_dict(state.policies[-1])
    assert state.policy == newest.to_dict()
    assert newest.version > stray and newest.effective_step == 0
    assert newest.members == ("b", "c")
    # A cluster with no member has nothing to govern: no policy is said for it.
    empty = FakeHost(FakeClock()).elect()
    assert empty.sched.policy is None or not empty.sched.policy.members
    assert empty.snapshot().policies == []


def test_a_new_role_knows_the_step_its_members_last_beat_not_the_snapshots() -> None:
    """The snapshot's step lags; a new scheduler takes the members' last heartbeats, so a
    joiner behind them is held for a holder of the newest state, not made the cluster's
    start (the simulator's seed 8852). A node not active says nothing of the state."""
    host, snap = successor("b")
    host.steps.update(b=snap.step + 6, x=snap.step + 50)  # x: heard, but no member
    role = host.elect()
    assert role.sched.step == snap.step + 6


def test_join_requests_produce_connect_replicate_commands_and_a_policy() -> None:
    host = FakeHost(FakeClock())
    host.steps.update(b=40, c=0)
    role = host.elect()
    join(host, role, "b")
    assert role.sched.policy.members == ("b",) and role.sched.nodes["b"].state == "active"
    host.queued.clear()
    rid = request(role, "c", "join", addr="10.0.0.c:7000", neighbors=["b"])
    assert host.reply_to(rid).args == {"req_id": rid, "error": None}
    assert sorted((n, c.args["peer"]) for n, c in host.commands("connect")) == [
        ("b", "c"), ("c", "b")]
    rep = host.commands("replicate")
    assert sorted(n for n, _ in rep) == ["b", "c"]
    args = rep[0][1].args
    assert args["new"] == "c" and args["sources"] == {"b": "10.0.0.b:7000"}
    policy = role.sched.policy
    assert policy.members == ("b", "c") and policy.version == 2
    assert policy.effective_step == args["version_step"] + 1 > 40
    assert role.sched.nodes["c"].state == "joining"
    # Every command carries the term and the leader, and a rising sequence number.
    cmds = [c for _, c in host.commands()]
    assert {(c.term, c.leader) for c in cmds} == {(1, ME)}
    assert [c.seq for c in cmds] == sorted(c.seq for c in cmds)
    assert all(q.qos == 1 and not q.retain for q in host.queued)


def test_bad_requests_get_an_error_reply_and_change_nothing() -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    version = role.sched.version
    rid = request(role, "b", "join", addr=5)
    assert "addr" in host.reply_to(rid).args["error"]
    rid = request(role, "b", "dance")
    assert host.reply_to(rid).args["error"] == "unknown request 'dance'"
    rid = request(role, "b", "link", peer="c", action="swap")
    assert "action" in host.reply_to(rid).args["error"]
    rid = request(role, "b", "link", peer="c", action="add")
    assert host.reply_to(rid).args["error"] == "unknown node 'b'"
    assert role.sched.policy is None and role.sched.version == version


def test_a_heartbeat_silent_peer_is_failed_and_scaled_in() -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "b", "c", "d")
    for _ in range(10):  # a steady rhythm, so the detector knows what to expect
        host.time.advance(0.5)
        for node in "bcd":
            host.beat(role, node)
        role.judge(host.live())
    version = role.sched.policy_version
    host.queued.clear()
    last_b = host.clock.monotonic()
    ticks = 0
    while "node-failed" not in kinds(role):
        ticks += 1
        assert ticks < 100, "b was never declared failed"
        host.time.advance(0.1)
        if ticks % 5 == 0:
            for node in "cd":
                host.beat(role, node)
        role.judge(host.live())
    silent = host.clock.monotonic() - last_b
    assert 1.0 < silent < 4.0  # about 2.1 s with the default detector
    failed, scale_in = role.sched.events[-2], role.sched.events[-1]
    assert failed.kind == "node-failed" and failed.node == "b"
    assert failed.detail["reason"] == "heartbeat" and failed.delay_ms == pytest.approx(
        silent * 1000.0)
    assert scale_in.kind == "scale-in" and scale_in.detail["reason"] == "failure"
    assert scale_in.detail["policy_version"] == version + 1
    policy = role.sched.policy
    assert policy.members == ("c", "d") and policy.effective_step == 0
    assert role.sched.nodes["b"].state == "failed"
    assert sorted((n, c.args["peer"]) for n, c in host.commands("disconnect")) == [
        ("c", "b"), ("d", "b")]
    for ticks in range(1, 21):  # judged again and again: still one failure
        host.time.advance(0.1)
        if ticks % 5 == 0:
            for node in "cd":
                host.beat(role, node)
        role.judge(host.live())
    assert kinds(role).count("node-failed") == 1


def test_an_admitted_node_that_never_beats_is_still_caught() -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    role.on_status(Status(node="b", online=True, reason="up", incarnation=1))
    role.judge(host.live())  # unknown to the detector: its clock starts now
    assert host.detector.known() == ["b"] and "node-failed" not in kinds(role)
    for _ in range(50):
        host.time.advance(0.1)
        role.judge(host.live())
    assert role.sched.nodes["b"].state == "failed"


def test_last_will_and_graceful_exit_of_a_daemon() -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "b", "c", "d")
    role.on_status(Status(node="b", online=False, reason="lost", incarnation=1))
    assert kinds(role)[-2:] == ["node-failed", "scale-in"]
    assert role.sched.events[-2].detail["reason"] == "last-will"
    role.on_status(Status(node="c", online=False, reason="left", incarnation=1))
    assert role.sched.nodes["c"].state == "left"
    assert role.sched.events[-1].kind == "scale-in"
    assert role.sched.events[-1].detail["reason"] == "daemon-left"
    assert role.sched.policy.members == ("d",)


# What each worker report carries, as chaos_edge/trainer sends it.
REPORTS: dict[str, dict[str, Any]] = {
    "link-failed": {"peer": "c", "reason": "connection reset"},
    "round-aborted": {"step": 12, "reason": "peer c failed"},
    "round-stuck": {"step": 12, "waited_s": 120.0, "reason": "last abort: peer c failed"},
    "snapshot-failed": {"reason": "/var/lib/chaos/snapshots: [Errno 30] Read-only"},
    "replicated": {"version": 3, "bytes": 4096, "delay_ms": 80.0, "transfer_ms": 60.0,
                   "strategy": "chaos", "sources": ["b", "c"], "per_source": {}},
    "stall": {"step": 12, "ms": 7.5, "reruns": 1, "reason": "peer c failed"},
    "serve-declined": {"new": "d", "reason": "needs 512 MiB, 100 MiB free"},
    "state-diverged": {"step": 12, "digest": "ab" * 32, "majority": "cd" * 32},
    "state-refused": {"reason": "d cannot join cluster state of step 3: model entry 'w' differs"},
}


def test_the_samples_cover_every_kind_a_worker_reports() -> None:
    assert sorted(REPORTS) == sorted(WORKER_REPORT_KINDS)


@pytest.mark.parametrize("kind", WORKER_REPORT_KINDS)
def test_every_report_kind_a_worker_sends_is_accepted(kind: str) -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "b", "c", "e")  # a triangle: one link may fail without a partition
    host.queued.clear()
    rid = request(role, "d", "join", addr="10.0.0.d:7000", neighbors=["b", "c"])
    assert {n for n, _ in host.commands("replicate")} == {"b", "c", "d"}  # b and c serve d
    args = dict(REPORTS[kind])
    if kind == "stall":
        args["policy_version"] = next(e.detail["policy_version"] for e in
                                      reversed(role.sched.events) if e.kind == "scale-out")
    sender = "d" if kind == "replicated" else "b"
    before = len(role.sched.events)
    rid = request(role, sender, "report", kind=kind, **args)
    assert host.reply_to(rid).args["error"] is None
    new = list(role.sched.events)[before:]
    if kind == "link-failed":
        assert [e.kind for e in new] == ["link-failed", "disconnect-link"]
        assert ("b", "c") not in {(lk.a, lk.b) for lk in role.sched.links}
        # At once (a failure), and d, still joining, is added back at its own step.
        now, then = list(role.sched.policies)[-2:]
        assert now.effective_step == 0 and "d" not in now.members
        assert then.effective_step > 0 and "d" in then.members
    elif kind == "replicated":
        assert role.sched.nodes["d"].state == "active"
        assert new[-1].kind == "scale-out" and new[-1].detail["bytes"] == 4096
    elif kind == "stall":
        assert role.sched.events[-1].detail["stall_ms"] == 7.5
    elif kind == "serve-declined":
        request(role, "d", "report", kind="replicated", version=3, bytes=64)
        ev = role.sched.events[-1]
        assert ev.kind == "scale-out" and ev.detail["declined"] == {"b": args["reason"]}
    elif kind == "state-diverged":
        diverged, dropped = list(role.sched.events)[-2:]
        assert diverged.kind == "state-diverged" and diverged.detail["majority"] == "cd" * 32
        assert dropped.kind == "scale-in" and dropped.detail["reason"] == "state-diverged"
    elif kind == "state-refused":  # logged; the worker-exit that follows scales it in
        assert new == []
    role.snapshot()  # whatever it was, the state still makes a valid snapshot


def test_a_link_failure_with_a_dying_peer_waits_for_the_node_failure() -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "b", "c")
    host.down.add("c")  # its last will is being confirmed
    version = role.sched.policy_version
    rid = request(role, "b", "report", kind="link-failed", peer="c", reason="reset")
    assert host.reply_to(rid).args["error"] is None
    assert role.sched.policy_version == version and "link-failed" not in kinds(role)


def test_snapshots_count_up_and_clear_dirty() -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "b")
    first = role.snapshot()
    assert not role.sched.dirty
    second = role.snapshot()
    assert second.version == first.version + 1
    assert (second.term, second.leader) == (1, ME)
    assert second.nodes["b"].state == "active" and second.policy["members"] == ["b"]


def test_a_decline_heard_only_by_the_new_node_is_on_the_event() -> None:
    # The source's serve-declined report can arrive after the new node's replicated one
    # (they publish on their own connections): the new node's account names it too.
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "b", "c", "e")
    request(role, "d", "join", addr="10.0.0.d:7000", neighbors=["b", "c"])
    request(role, "d", "report", kind="replicated", version=3, bytes=64,
            declined={"b": "short of memory"})
    ev = role.sched.events[-1]
    assert ev.kind == "scale-out" and ev.detail["declined"] == {"b": "short of memory"}
    request(role, "b", "report", kind="serve-declined", new="d", reason="late")  # harmless
    assert role.sched.events[-1] is ev


def test_a_link_failure_reported_during_a_join_cuts_nothing() -> None:
    # node d froze, was failed, and rejoins: b's link to it from before the freeze breaks as d
    # comes back, and b's report arrives just after the join made the new b-d link.
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "b", "c", "e")
    request(role, "d", "join", addr="10.0.0.d:7000", neighbors=["b", "c"])
    version = role.sched.policy_version
    rid = request(role, "b", "report", kind="link-failed", peer="d", reason="broken pipe")
    assert host.reply_to(rid).args["error"] is None
    assert "disconnect-link" not in kinds(role) and role.sched.policy_version == version
    request(role, "d", "report", kind="replicated", version=3, bytes=64)
    request(role, "b", "report", kind="link-failed", peer="d", reason="reset")  # joined now
    assert "disconnect-link" in kinds(role)


def test_a_new_role_scales_in_a_member_whose_daemon_left_before_it_was_elected() -> None:
    """The old scheduler left (or died) before it acted on a member's presence: the new one
    scales that member in by a policy. Marked left without one, the old policy still named
    it and the members waited on it for rounds nobody could finish (the simulator's seed
    319)."""
    host, _ = successor("b", "c")
    host.presence["b"] = Status(node="b", online=False, reason="left", incarnation=1)
    host.presence["c"] = Status(node="c", online=True, reason="up", incarnation=1, addr="x")
    role = host.elect()
    assert role.sched.nodes["b"].state == "left"
    assert role.sched.policy is not None and role.sched.policy.members == ("c",)
    assert role.sched.policy.effective_step == 0  # at once: the rounds waiting on b rerun
    assert [e.detail.get("reason") for e in role.sched.events if e.kind == "scale-in"] == [
        "daemon-left"]


def test_a_scheduler_back_as_a_new_process_scales_its_own_old_membership_in() -> None:
    """After a power cut of every box, the scheduler's box came back as a new process and
    took the seat again, its own record still active at the cluster's step: joins were
    planned from it at step 0 while its new worker held only a snapshot, and the rounds
    waited on joiners with no state (the soak: no step for two minutes). Its own box is
    judged like any other that came back as a new process."""
    clock = FakeClock()
    first = FakeHost(clock)
    old = first.elect()
    join(first, old, ME, "b")  # its own box trains too
    snap = old.snapshot()
    assert snap.nodes[ME].state == "active"
    host = FakeHost(clock, view=snap)
    host.election.term = snap.term
    host.incarnation = 2  # the power came back
    role = host.elect()
    assert role.sched.nodes[ME].state == "standby"
    assert role.sched.policy is not None and ME not in role.sched.policy.members
    failed = [e for e in role.sched.events if e.kind == "node-failed"]
    assert [(e.node, e.detail["reason"]) for e in failed] == [(ME, "restarted")]


def test_a_heartbeat_counts_the_step_its_worker_holds_not_the_daemons_last_poll() -> None:
    """chaosd's own step is its worker's last poll. A worker that crashed at 500 and was
    restarted from a snapshot of 400 holds 400 until it polls: counted as 500, the scheduler
    waited for a state nobody holds; counted as 0 (a daemon that restarted too), it could let
    an older joiner start the cluster over."""
    host = FakeHost(FakeClock())
    role = host.elect()
    host.detector.heartbeat("b")
    host.heard["b"] = host.clock.monotonic()
    for step, holds in ((500, 400), (0, 400)):
        role.on_heartbeat(Heartbeat(node="b", seq=1, incarnation=1, step=step, state="standby",
                                    cpu_percent=0.0, mem_percent=0.0, holds=holds), "10.0.0.2")
        assert role.neg._held_elsewhere("c") == 400
    role.on_heartbeat(Heartbeat(node="b", seq=2, incarnation=1, step=400, state="standby",
                                cpu_percent=0.0, mem_percent=0.0, holds=-1), "10.0.0.2")
    assert role.neg._held_elsewhere("c") == -1  # no worker attached: it holds nothing


@pytest.mark.parametrize("paused", [False, True])
def test_a_role_elected_on_a_view_from_before_its_pause_has_its_own_worker_rejoin(
        paused: bool) -> None:
    """A daemon paused (SIGSTOP, a suspend) may have been set aside meanwhile, the snapshot
    saying so lost; elected before a newer one came, its own member must not train on from
    the old view (the simulator's seed 3367). Unpaused, it is a member as before."""
    host, snap = successor(ME, "b")
    assert snap.nodes[ME].state == "active"
    host.paused_since_view = paused
    role = host.elect()
    policy = role.sched.policy
    assert policy is not None and "b" in policy.members
    assert (ME in policy.members) is not paused
    assert role.sched.nodes[ME].state == ("standby" if paused else "active")
    if paused:  # its worker, left out, asks to join with what it holds: b is its source
        host.steps[ME] = host.steps["b"] = 3
        host.beat(role, "b")
        rid = request(role, ME, "join", addr=f"10.0.0.{ME}:7000", neighbors=[], step=3)
        assert host.reply_to(rid).args["error"] is None
        (cmd,) = [c for n, c in host.commands("replicate") if n == ME and c.term == role.term]
        assert list(cmd.args["sources"]) == ["b"]


def test_a_role_elected_after_a_power_cut_counts_the_snapshot_on_its_own_disk() -> None:
    """The e2e power cut that took the broker too: the first scheduler after it judged a
    peer's join (holding its snapshot of 368) before the echo of its own heartbeat came back
    through the broker, so the 372 on its own disk was unknown, and 368 started the cluster
    over. Read at election, our disk holds the joiner back until our worker asks."""
    host = FakeHost(FakeClock())
    host.disk = 372
    role = host.elect()
    st = Status(node="a", online=True, reason="up", incarnation=1, addr="10.0.0.a")
    host.presence["a"] = st
    role.on_status(st)
    host.beat(role, "a")
    request(role, "a", "join", addr="10.0.0.a:7000", neighbors=[], step=368)
    assert not host.commands("bootstrap") and role.neg.held == {"a": 368}
    request(role, ME, "join", addr="10.0.0.1:7000", neighbors=[], step=372)
    assert [n for n, _ in host.commands("bootstrap")] == [ME]
    [rep] = [c for n, c in host.commands("replicate") if n == "a"]
    assert list(rep.args["sources"]) == [ME]  # a pulls the newer state
