"""The four primitives as scheduler state transitions, with a fake clock."""

from __future__ import annotations

import pytest

from daemon.cluster.primitives import (
    HAND_OVER_S,
    HOLD_S,
    SILENT_WAIT_S,
    UNHEARD_WAIT_S,
    JoinPhase,
    Negotiator,
)
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.errors import MessageError
from daemon.contracts.policy import TERM_POLICY_SPAN
from daemon.contracts.protocol import (
    Bootstrap,
    Replicate,
    Replicated,
    ServeDeclined,
    Stall,
    parse_request,
)

pytestmark = pytest.mark.timeout(30)


def make(steps: dict[str, int] | None = None) -> tuple[Negotiator, FakeClock]:
    clock = FakeClock()
    sched = Scheduler("s", 1, None, clock)
    return Negotiator(sched, clock, lambda n: (steps or {}).get(n, 0)), clock


def cmds(neg: Negotiator, op: str) -> list[tuple[str, dict[str, object]]]:
    """The commands of ``op`` queued, in their wire form."""
    return [(node, body.to_args()) for node, body in neg.out if op == body.OP]


def handle(neg: Negotiator, node: str, op: str, args: dict[str, object]) -> str | None:
    """A request as the agent hands it on: parsed first (a malformed one is refused there)."""
    try:
        body = parse_request(op, args)
    except MessageError as exc:
        return str(exc)
    return neg.handle(node, body)


def done(**fields: object) -> Replicated:
    """A new node's ``replicated`` report."""
    return Replicated(version=0, **fields)  # type: ignore[arg-type]


def grow(neg: Negotiator, *nodes: str) -> None:
    """Join nodes one by one, each completing its replication."""
    for node in nodes:
        neg.join(node, f"127.0.0.1:{1000 + len(neg.sched.nodes)}", [])
        neg.replicated(node, done())


def test_first_node_bootstraps_alone() -> None:
    neg, _ = make()
    neg.join("a", "127.0.0.1:1", [])
    assert neg.sched.nodes["a"].state == "active"
    assert neg.sched.policy.members == ("a",) and neg.sched.policy.root == "a"
    assert neg.sched.events[-1].kind == "scale-out" and neg.sched.events[-1].detail["bootstrap"]
    # No one to connect to or copy from: it is told to start alone.
    assert neg.out == [("a", Bootstrap(new="a", policy_version=1))]


def test_scale_out_links_replicates_and_takes_effect_later() -> None:
    neg, clock = make({"a": 40, "b": 41})
    grow(neg, "a", "b")
    neg.out.clear()
    neg.join("c", "127.0.0.1:9", ["b", "zz"])  # an unknown wish is dropped
    assert neg.sched.nodes["c"].state == "joining"
    assert sorted(n for n, _ in cmds(neg, "connect")) == ["b", "c"]
    policy = neg.sched.policy
    assert policy.members == ("a", "b", "c")
    # After the margin, one past the snapshot: b said step 41, but it became a member with
    # the replica of step 40 + 2, and no member is behind the step it joined at.
    assert policy.effective_step == 42 + 2 + 1
    policy.validate()  # a valid spanning tree
    rep = cmds(neg, "replicate")
    assert sorted(n for n, _ in rep) == ["b", "c"]
    assert rep[0][1]["sources"] == {"b": neg.sched.nodes["b"].data_addr}
    assert rep[0][1]["strategy"] == "chaos"
    clock.advance(1.5)
    neg.replicated("c", done(bytes=10))
    ev = neg.sched.events[-1]
    assert neg.sched.nodes["c"].state == "active"
    assert ev.kind == "scale-out" and ev.delay_ms == pytest.approx(1500.0)
    assert ev.detail["bytes"] == 10


def test_scale_out_asks_every_neighbour_to_serve() -> None:
    neg, _ = make({"a": 40, "b": 41, "c": 41})
    grow(neg, "a", "b", "c")
    neg.out.clear()
    neg.join("d", "127.0.0.1:9", [], rtts={"a": 0.4, "b": 0.1, "c": 2.0})
    rep = dict(cmds(neg, "replicate"))
    # The two nearest by RTT are the neighbours, and both serve: the new node plans the split.
    assert sorted(rep) == ["a", "b", "d"]
    args = rep["d"]
    assert sorted(args["sources"]) == ["a", "b"] == sorted(args["neighbors"])
    assert args["links"]["b"]["rtt_ms"] == 0.1 and args["links"]["a"]["bandwidth_mbps"] is None


def test_graceful_leave_and_failure() -> None:
    neg, _ = make({"a": 5, "b": 5, "c": 5})
    grow(neg, "a", "b", "c")
    neg.out.clear()
    neg.leave("c", 7)
    assert neg.sched.nodes["c"].state == "left"
    # c joined with the replica of step 7 + 2 (its daemon's word of step 5 is older): the
    # leave takes effect a margin past that.
    assert neg.sched.policy.members == ("a", "b") and neg.sched.policy.effective_step == 11
    assert neg.sched.events[-1].kind == "scale-in"
    assert all(n != "c" for n, _ in cmds(neg, "disconnect"))  # only survivors are told
    version = neg.sched.policy_version
    neg.sched.fail("b", "heartbeat", 2.0)
    neg.gone("b", "failure")
    assert neg.sched.policy.members == ("a",) and neg.sched.policy.effective_step == 0
    assert neg.sched.policy_version == version + 1
    assert neg.sched.events[-1].detail["reason"] == "failure"


def test_link_add_del_and_errors() -> None:
    neg, _ = make()
    grow(neg, "a", "b", "c", "d")  # auto neighbours: the two lowest ids
    assert sorted(neg.sched.nodes["d"].neighbors) == ["a", "b"]
    assert neg.link("a", "a", up=True) == "a node cannot link to itself"
    assert neg.link("a", "ghost", up=True) == "unknown node 'ghost'"
    before = neg.sched.policy_version
    assert neg.link("c", "d", up=True) is None
    assert neg.sched.events[-1].kind == "connect-link"
    assert neg.sched.policy_version == before + 1
    assert sorted(neg.sched.nodes["c"].neighbors) == ["a", "b", "d"]
    assert neg.link("c", "d", up=True) is None  # already there: no event
    assert neg.sched.policy_version == before + 1
    assert neg.link("a", "c", up=False, failed=True) is None
    kinds = [e.kind for e in neg.sched.events][-2:]
    assert kinds == ["link-failed", "disconnect-link"]
    assert neg.sched.policy.effective_step == 0  # a failure: at once


def test_partition_keeps_the_largest_part_and_a_link_reunites() -> None:
    neg, _ = make()
    grow(neg, "a", "b", "c")
    neg.join("d", "127.0.0.1:4", ["a"])  # d hangs off a alone
    neg.replicated("d", done())
    neg.link("a", "d", up=False)
    assert neg.sched.events[-2].kind == "partition"
    assert neg.sched.events[-2].detail["kept"] == ["a", "b", "c"]
    assert neg.sched.nodes["d"].state == "standby"
    assert neg.sched.policy.members == ("a", "b", "c")
    neg.out.clear()
    neg.link("c", "d", up=True)  # the link back: d rejoins by scale-out
    assert neg.sched.nodes["d"].state == "joining"
    assert [n for n, _ in cmds(neg, "replicate")] == ["d", "c"]


def test_a_partitioned_node_linked_back_holds_the_step_it_said_not_an_extrapolated_one() -> None:
    """Cut off, a node stands still; extrapolated at its old rate, a moment later it looked
    ahead of the members and the cluster started over from its stale state (the simulator's
    seed 27921). A join holds the step the node last reported."""
    clock = FakeClock()
    sched = Scheduler("s", 1, None, clock)
    said = {"a": 30, "b": 30, "c": 30, "d": 25}
    ahead = {**said, "d": 60}  # what extrapolating d's old rate would say
    neg = Negotiator(sched, clock, ahead.__getitem__, reported=said.__getitem__)
    grow(neg, "a", "b", "c")
    neg.join("d", "127.0.0.1:4", ["a"])
    neg.replicated("d", done())
    neg.link("a", "d", up=False)  # d is cut off: the largest part trains on
    neg.link("c", "d", up=True)
    assert neg.sched.nodes["d"].state == "joining"  # from the members, not their new start
    assert neg.joins["d"].holds == 25
    assert not [e for e in neg.sched.events if e.kind in ("state-lost", "state-restored")]


def test_a_tied_partition_keeps_the_schedulers_own_part() -> None:
    """Cut off with one peer, the scheduler keeps its own side: it is surely up and reaches it.
    Keeping the lower id used to set the scheduler's own node aside to rejoin from a peer that
    was about to be declared failed."""
    clock = FakeClock()
    neg = Negotiator(Scheduler("c", 2, None, clock), clock, lambda n: 0)
    grow(neg, "b", "c")
    neg.link("b", "c", up=False, failed=True)
    partition = next(e for e in neg.sched.events if e.kind == "partition")
    assert partition.detail["kept"] == ["c"]
    assert neg.sched.policy.members == ("c",) and neg.sched.nodes["b"].state == "standby"


def test_a_partition_keeps_the_part_whose_members_are_up() -> None:
    """Members whose daemons went silent do not count: the larger part here is mostly gone."""
    clock = FakeClock()
    silent = {"a", "b"}
    neg = Negotiator(Scheduler("d", 2, None, clock), clock, lambda n: 0,
                     alive=lambda n: n not in silent)
    grow(neg, "a", "b", "c")
    neg.join("d", "127.0.0.1:4", ["c"])
    neg.replicated("d", done())
    neg.join("e", "127.0.0.1:5", ["d"])
    neg.replicated("e", done())
    neg.link("c", "d", up=False)  # parts: a, b, c (two of them silent) and d, e
    partition = [e for e in neg.sched.events if e.kind == "partition"][-1]
    assert partition.detail["kept"] == ["d", "e"]
    assert neg.sched.policy.members == ("d", "e")
    neg.sched.policy.validate()


def test_a_join_whose_sources_all_go_is_planned_again() -> None:
    """A new node pulling from one source that dies is sent to the members left; when none is
    left it bootstraps, instead of retrying a dead source until its own timeout."""
    neg, clock = make()
    grow(neg, "a", "b", "c")
    neg.out.clear()
    neg.join("d", "127.0.0.1:4", ["c"])
    neg.join("e", "127.0.0.1:5", ["d", "c"])  # a joiner is no source: e pulls from c only
    assert dict(cmds(neg, "replicate"))["e"]["sources"] == {"c": neg.sched.nodes["c"].data_addr}
    neg.out.clear()
    neg.sched.fail("c", "heartbeat", 2.0)
    neg.gone("c", "failure")
    rep = dict(cmds(neg, "replicate"))
    assert sorted(rep["d"]["sources"]) == sorted(rep["e"]["sources"]) == ["a", "b"]
    assert neg.sched.nodes["d"].state == neg.sched.nodes["e"].state == "joining"
    for node in ("a", "b"):
        neg.sched.fail(node, "heartbeat", 2.0)
        neg.gone(node, "failure")
    # No one holds the state any more: once the silent members had SILENT_WAIT_S to be heard
    # again, the first bootstraps, the other pulls from it.
    assert neg.sched.nodes["d"].state == "standby" and not cmds(neg, "bootstrap")
    clock.advance(SILENT_WAIT_S)
    neg.tick()
    assert neg.sched.nodes["d"].state == "active"
    assert any(e.kind == "scale-out" and e.node == "d" and e.detail.get("bootstrap")
               for e in neg.sched.events)
    assert dict(cmds(neg, "replicate"))["e"]["sources"] == {"d": "127.0.0.1:4"}


def test_a_repeated_join_request_resends_the_commands_a_broker_restart_lost() -> None:
    """A broker restarted without persistence loses QoS 1 commands in flight: the worker that
    got no replicate asks again, and the same command goes to it and its sources again."""
    neg, _ = make()
    grow(neg, "a", "b")
    neg.out.clear()
    neg.join("c", "127.0.0.1:3", ["a", "b"])
    first = [(n, args) for n, args in cmds(neg, "replicate")]
    version = neg.sched.policy_version
    neg.out.clear()
    neg.join("c", "127.0.0.1:3", ["a", "b"])
    assert cmds(neg, "replicate") == first
    assert neg.sched.policy_version == version  # nothing planned anew
    assert [e.node for e in neg.sched.events if e.kind == "scale-out"] == ["a", "b"]


def test_a_report_of_an_older_plans_state_does_not_end_the_join() -> None:
    """The joiner's pull of an older plan (a deposed scheduler's) ended after this one
    planned the join: its state is older than the step this plan names. Made active with it,
    the node trained alone on an older state than a member held (the simulator's seed 397)."""
    neg, _ = make({"a": 40, "b": 40})
    grow(neg, "a", "b")
    neg.join("c", "127.0.0.1:3", ["a", "b"])
    plan = neg.joins["c"].command.policy_version
    neg.replicated("c", done(plan=plan - 1))
    assert neg.sched.nodes["c"].state == "joining" and "c" in neg.joins
    neg.replicated("c", done(plan=plan))
    assert neg.sched.nodes["c"].state == "active" and "c" not in neg.joins


def test_stall_reports_attach_to_their_event() -> None:
    neg, _ = make()
    grow(neg, "a", "b")
    neg.link("a", "b", up=False)
    version = neg.sched.policy_version
    neg.stall("a", Stall(step=9, ms=0.4, policy_version=version))
    neg.stall("b", Stall(step=9, ms=0.9, policy_version=version))
    assert neg.sched.events[-1].detail["stall_ms"] == 0.9


def test_handle_rejects_malformed_requests() -> None:
    neg, _ = make()
    assert handle(neg, "a", "join", {"addr": 3}) is not None
    assert handle(neg, "a", "link", {"peer": "b"}) is not None
    assert handle(neg, "a", "dance", {}) == "unknown request 'dance'"


def test_a_fast_cluster_gets_a_longer_lead_before_a_planned_change() -> None:
    steps = {"a": 100, "b": 100}
    neg, clock = make(steps)
    grow(neg, "a", "b")
    assert neg.lead() == 2  # no rate known yet: the minimum margin
    for _ in range(20):  # 40 steps/s, seen through the heartbeats
        clock.advance(0.25)
        steps["a"] += 10
        steps["b"] += 10
        neg.observe_progress()
    assert neg.lead() == 20  # half a second of steps: the policy reaches everyone first
    neg.leave("b", steps["b"])
    assert neg.sched.policy.effective_step == steps["a"] + 20
    for _ in range(30):  # a slow cluster: one step a second
        clock.advance(0.25)
        steps["a"] += 1 if _ % 4 == 0 else 0
        neg.observe_progress()
    assert neg.lead() == 2


def test_a_leaver_gone_before_its_leave_took_effect_is_dropped_at_once() -> None:
    """The rounds up to a leave's step need the leaver; if its worker exits before (its
    drain timed out), the policy without it must govern now, or the others wait for ever."""
    steps = {"a": 10, "b": 10, "c": 10}
    neg, _ = make(steps)
    grow(neg, "a", "b", "c")
    neg.leave("c", 10)
    leave = neg.sched.policy
    assert leave.effective_step > 10 and "c" not in leave.members
    handle(neg, "c", "worker-exit", {"code": 0})
    now = neg.sched.policy
    assert now.version == leave.version + 1 and now.effective_step == 0
    assert now.members == ("a", "b")
    # Once the leave has taken effect, the leaver's exit changes nothing.
    neg.join("c", "127.0.0.1:7", [])
    neg.replicated("c", done())
    neg.leave("c", 12)
    steps.update(a=40, b=40)
    version = neg.sched.policy.version
    handle(neg, "c", "worker-exit", {"code": 0})
    assert neg.sched.policy.version == version


DIGEST, MAJORITY = "ab" * 32, "CD" * 32


def test_a_diverged_member_is_recorded_dropped_at_once_and_can_rejoin() -> None:
    neg, _ = make({"a": 30, "b": 30, "c": 30})
    grow(neg, "a", "b", "c")
    version = neg.sched.policy_version
    neg.out.clear()
    args = {"kind": "state-diverged", "step": 30, "digest": DIGEST, "majority": MAJORITY}
    assert handle(neg, "c", "report", args) is None
    diverged, scale_in = neg.sched.events[-2], neg.sched.events[-1]
    assert diverged.kind == "state-diverged" and diverged.node == "c"
    assert diverged.detail == {"step": 30, "digest": DIGEST, "majority": MAJORITY.lower()}
    assert scale_in.kind == "scale-in" and scale_in.detail["reason"] == "state-diverged"
    # As for a failure: a policy without it governs at once, and the survivors are told.
    policy = neg.sched.policy
    assert policy is not None and policy.members == ("a", "b") and policy.effective_step == 0
    assert neg.sched.policy_version == version + 1
    assert neg.sched.nodes["c"].state == "standby" and not neg.sched.nodes["c"].neighbors
    assert {n for n, _ in cmds(neg, "disconnect")} >= {"a", "b"}
    # Its worker is still attached: it asks to rejoin and is re-replicated by scale-out.
    neg.out.clear()
    handle(neg, "c", "join", {"addr": neg.sched.nodes["c"].data_addr, "neighbors": []})
    assert neg.sched.nodes["c"].state == "joining"
    assert "c" in [n for n, _ in cmds(neg, "replicate")]
    neg.replicated("c", done())
    assert neg.sched.events[-1].kind == "scale-out" and neg.sched.nodes["c"].state == "active"
    assert neg.sched.policy is not None and neg.sched.policy.members == ("a", "b", "c")


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ({"digest": DIGEST, "majority": MAJORITY}, "missing field 'step'"),
        ({"step": True, "digest": DIGEST, "majority": MAJORITY}, "expected an integer"),
        ({"step": -1, "digest": DIGEST, "majority": MAJORITY}, "step must be >= 0"),
        ({"step": 3, "digest": DIGEST[:-1], "majority": MAJORITY}, "64 hex digits"),
        ({"step": 3, "digest": DIGEST, "majority": "zz" * 32}, "64 hex digits"),
        ({"step": 3, "digest": b"\0" * 32, "majority": MAJORITY}, "expected a string"),
        ({"step": 3, "majority": MAJORITY}, "missing field 'digest'"),
        ({"step": 3, "digest": DIGEST, "majority": DIGEST.upper()}, "no divergence"),
    ],
)
def test_a_malformed_divergence_report_is_refused_and_changes_nothing(
    args: dict[str, object], error: str
) -> None:
    neg, _ = make()
    grow(neg, "a", "b")
    events, version = len(neg.sched.events), neg.sched.policy_version
    result = handle(neg, "b", "report", {"kind": "state-diverged", **args})
    assert result is not None and error in result
    assert len(neg.sched.events) == events and neg.sched.policy_version == version
    assert neg.sched.nodes["b"].state == "active"


def test_a_divergence_report_of_a_node_no_longer_a_member_only_records_it() -> None:
    neg, _ = make()
    grow(neg, "a", "b", "c")
    neg.gone("c", "failure")
    version = neg.sched.policy_version
    args = {"kind": "state-diverged", "step": 3, "digest": DIGEST, "majority": MAJORITY}
    assert handle(neg, "c", "report", args) is None
    assert neg.sched.events[-1].kind == "state-diverged"
    assert neg.sched.policy_version == version  # no second scale-in
    assert handle(neg, "ghost", "report", args) == "unknown node 'ghost'"


def test_a_join_is_one_record_with_a_phase() -> None:
    """The scheduler holds each join as one record: commanded until the node reports it is
    done; an orphaned one (every source gone) is planned again as a new record."""
    neg, clock = make()
    grow(neg, "a", "b")
    neg.join("c", "127.0.0.1:3", ["b"])
    join = neg.joins["c"]
    assert join.phase is JoinPhase.COMMANDED and join.member_from == join.command.version_step + 1
    assert join.command.sources == {"b": neg.sched.nodes["b"].data_addr}
    assert join.command.policy_version == neg.sched.policy_version
    neg.sched.fail("b", "heartbeat", 2.0)
    neg.gone("b", "failure")
    assert join.phase is JoinPhase.ORPHANED
    again = neg.joins["c"]
    assert again is not join and again.phase is JoinPhase.COMMANDED
    assert list(again.command.sources) == ["a"]
    clock.advance(0.5)
    neg.replicated("c", done())
    assert "c" not in neg.joins and neg.sched.nodes["c"].state == "active"


def test_no_connect_command_names_a_node_without_a_worker() -> None:
    """A link to a node whose worker is gone (no data-plane address) sent ``connect`` with an
    empty address, which the worker could not parse (seen in the 15-minute soak). Only an end
    whose peer has a worker is told to connect now."""
    neg, _ = make()
    grow(neg, "a", "b", "c")
    assert handle(neg, "c", "worker-exit", {"code": 1}) is None
    assert neg.sched.nodes["c"].data_addr == ""
    neg.out.clear()
    assert neg.link("a", "c", up=True) is None
    connects = cmds(neg, "connect")
    assert [n for n, _ in connects] == ["c"]  # a is not told to dial a worker that is gone
    assert all(args["addr"] == neg.sched.nodes["a"].data_addr for _, args in connects)


def test_a_part_of_joiners_alone_is_never_kept_over_a_holder_of_the_state() -> None:
    """The simulator's seed 1: the hub of a star died; the new scheduler's own node, still
    joining (no state), was cut off from the holder; keeping it (our own part, a tie on
    size) bootstrapped a fresh model and set the holder aside."""
    clock = FakeClock()
    neg = Negotiator(Scheduler("b", 2, None, clock), clock, lambda n: 0)
    grow(neg, "a", "c")
    neg.join("b", "127.0.0.1:2", ["a"])  # b joins from a alone: its only link is to a
    assert neg.sched.nodes["b"].state == "joining"
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    assert neg.sched.nodes["c"].state == "active"
    assert neg.sched.policy is not None and "c" in neg.sched.policy.members
    assert not any(e.kind == "scale-out" and e.detail.get("bootstrap") and e.node == "b"
                   for e in neg.sched.events)
    assert neg.joins["b"].command.sources == {"c": neg.sched.nodes["c"].data_addr}


def test_with_no_member_left_a_fresh_joiner_waits_for_a_holder_of_the_state() -> None:
    """The simulator's seed 4: every member was cut off with its site; a site back first
    bootstrapped a fresh model while the holders were alive. A joiner behind the cluster's
    step now waits for a holder (it starts the cluster again, state-restored), or HOLD_S,
    after which the best state held back starts it over (state-lost, with the steps lost)."""
    neg, _ = make()
    grow(neg, "a", "b")
    neg.sched.step = 500  # what the heartbeats said
    for node in ("a", "b"):
        neg.sched.fail(node, "heartbeat", 2.0)
        neg.gone(node, "failure")
    neg.out.clear()
    neg.join("c", "127.0.0.1:3", [], step=0)
    assert neg.held == {"c": 0} and neg.sched.nodes["c"].state == "standby"
    assert cmds(neg, "bootstrap") == []
    neg.join("a", "127.0.0.1:1", [], step=500)  # a holder is back: it starts the cluster again
    neg.observe_worker("b", "standby", 500)  # once b, silent too, is heard (or SILENT_WAIT_S)
    neg.tick()
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["a"]
    restored = [e for e in neg.sched.events if e.kind == "state-restored"]
    assert restored and restored[-1].detail["steps_lost"] == 0
    assert neg.sched.nodes["c"].state == "joining" and neg.joins["c"].command.sources == {
        "a": "127.0.0.1:1"}
    assert neg.held == {}


def test_with_no_holder_back_in_time_the_best_state_starts_over_and_says_so() -> None:
    neg, clock = make()
    grow(neg, "a")
    neg.sched.step = 300
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    neg.join("c", "127.0.0.1:3", [], step=0)
    neg.join("d", "127.0.0.1:4", [], step=280)  # a former member, a little behind
    neg.tick()
    assert neg.held == {"c": 0, "d": 280}
    clock.advance(HOLD_S)
    neg.tick()
    assert neg.sched.nodes["d"].state == "active" and neg.sched.step == 280
    # Some state survives: restored, with the steps since said lost (state-lost is a fresh
    # model, when nothing survives).
    back = [e for e in neg.sched.events if e.kind == "state-restored"]
    assert back and back[-1].node == "d" and back[-1].detail["steps_lost"] == 20
    assert not [e for e in neg.sched.events if e.kind == "state-lost"]
    assert neg.joins["c"].command.sources == {"d": "127.0.0.1:4"}


def test_the_hub_of_a_star_fails_and_its_survivors_are_linked_again() -> None:
    """The simulator's seed 3: b and c hung off a alone; a failed and took every link, and the
    partition rule kept one survivor and made the other rejoin by scale-out. The overlay is
    healed instead: the survivors are linked to each other and both train on."""
    neg, _ = make()
    grow(neg, "a")
    for node in ("b", "c"):
        neg.join(node, f"127.0.0.1:{ord(node)}", ["a"])
        neg.replicated(node, done())
    assert {(lk.a, lk.b) for lk in neg.sched.links} == {("a", "b"), ("a", "c")}
    neg.out.clear()
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    assert {(lk.a, lk.b) for lk in neg.sched.links} == {("b", "c")}
    assert sorted(n for n, _ in cmds(neg, "connect")) == ["b", "c"]
    assert neg.sched.policy is not None and neg.sched.policy.members == ("b", "c")
    assert not any(e.kind == "partition" for e in neg.sched.events)
    assert neg.sched.nodes["b"].state == neg.sched.nodes["c"].state == "active"


def test_the_hold_counts_from_when_the_last_member_went() -> None:
    """The simulator's seed 52: an earlier empty spell left the clock running; when the last
    member went again much later, a fresh joiner started the cluster over at once."""
    neg, clock = make()
    grow(neg, "a")
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    neg.join("a", "127.0.0.1:1", [], step=0)  # the empty spell: a is back at once
    clock.advance(2 * HOLD_S)
    neg.sched.step = 40
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    neg.join("c", "127.0.0.1:3", [], step=0)
    assert neg.held == {"c": 0}  # held: the clock started when a went, just now


def test_when_the_last_member_goes_a_policy_without_members_says_so() -> None:
    """The simulator's seed 52: the scheduler dropped the last member and published nothing,
    so a worker still holding the state waited for a round under the old policy, never asked
    to join, and the joiners held back for a holder waited in vain."""
    neg, _ = make()
    grow(neg, "a", "b")
    version = neg.sched.policy_version
    for node in ("a", "b"):
        neg.sched.fail(node, "heartbeat", 2.0)
        neg.gone(node, "failure")
    empty = neg.sched.policy
    assert empty is not None and empty.members == () and empty.version > version
    assert neg.sched.policies[-1] is empty
    neg.gone("a", "failure")  # nothing more to say
    assert neg.sched.policy is empty


def test_the_overlay_is_healed_among_active_members_not_through_a_joiner() -> None:
    """The simulator's seed 227: the hub froze while a node joined; the survivors were linked
    through the joiner, which the policy that takes effect at once leaves out, so that policy
    split them and the partition rule set one survivor aside."""
    neg, _ = make()
    grow(neg, "a")
    for node in ("b", "c"):
        neg.join(node, f"127.0.0.1:{ord(node)}", ["a"])
        neg.replicated(node, done())
    neg.join("d", "127.0.0.1:100", ["a"])  # a joiner hanging off the hub too
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    assert ("b", "c") in {(lk.a, lk.b) for lk in neg.sched.links}
    assert not any(e.kind == "partition" for e in neg.sched.events)
    now = [p for p in neg.sched.policies if p.effective_step == 0][-1]
    assert {"b", "c"} <= set(now.members)


def test_a_joiner_whose_worker_trains_finished_its_join_even_if_its_report_was_lost() -> None:
    """The simulator's seed 1389: the new node's replicated report went to a scheduler that
    died the moment it was sent; the next scheduler listed the node as joining for ever, so it
    held no state in its eyes, and the next joiner bootstrapped a fresh model."""
    neg, _ = make()
    grow(neg, "a")
    neg.join("b", "127.0.0.1:2", ["a"])
    neg.sched.step = 40
    neg.observe_worker("b", "joining", 40)
    assert neg.sched.nodes["b"].state == "joining"
    neg.observe_worker("b", "active", 45)  # its heartbeat: the worker trains
    assert neg.sched.nodes["b"].state == "active" and "b" not in neg.joins
    assert neg.sched.events[-1].kind == "scale-out" and neg.sched.step == 45


def test_a_joiner_ahead_of_every_member_is_where_the_cluster_goes_on_from() -> None:
    """The simulator's seed 2400: the active members had stalled (frozen) while a node trained
    on elsewhere; dropped, it asked to rejoin holding a newer state, pulled the members' older
    one, and its steps were lost while it held them. Now the members pull from it."""
    steps = {"a": 19, "b": 19, "c": 25}
    neg, _ = make(steps)
    grow(neg, "a", "b")
    neg.sched.step = 19
    for m in ("a", "b"):
        neg.observe_worker(m, "active", 19)  # their heartbeats (the ones we judge by)
    neg.out.clear()
    neg.join("c", "127.0.0.1:3", [], step=25)
    assert neg.sched.nodes["c"].state == "active"
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["c"]
    restored = [e for e in neg.sched.events if e.kind == "state-restored"][-1]
    assert restored.node == "c" and restored.detail["step"] == 25
    for m in ("a", "b"):
        assert neg.sched.nodes[m].state == "joining"
        assert neg.joins[m].command.sources == {"c": "127.0.0.1:3"}


def link_failed(neg: Negotiator, node: str, peer: str) -> None:
    assert handle(neg, node, "report", {"kind": "link-failed", "peer": peer}) is None


def test_links_failing_to_one_member_from_two_peers_take_its_worker_for_failed() -> None:
    """The simulator's seed 50: the hub of a star lost its worker unnoticed (its owner started
    another script), and each neighbour's report cut that neighbour off in turn, until the
    last tie kept the hub, the scheduler's own node, holding nothing. Two peers' links failing
    to one member say its worker broke: it is scaled in and the survivors linked again."""
    clock = FakeClock()
    neg = Negotiator(Scheduler("a", 1, None, clock), clock, lambda n: 0)
    grow(neg, "a")
    for node in ("b", "c", "d"):
        neg.join(node, f"127.0.0.1:{ord(node)}", ["a"])
        neg.replicated(node, done())
    link_failed(neg, "c", "a")  # one report: c may be the broken one; it is set aside
    assert neg.sched.nodes["c"].state == "standby"
    link_failed(neg, "d", "a")  # a second peer blames a: a's worker broke
    assert neg.sched.nodes["a"].state == "standby"
    assert any(e.kind == "scale-in" and e.node == "a" and e.detail["reason"] == "links-failed"
               for e in neg.sched.events)
    assert neg.sched.policy is not None and neg.sched.policy.members == ("b", "d")
    assert {(lk.a, lk.b) for lk in neg.sched.links} == {("b", "d")}


def test_a_member_set_aside_is_never_ahead_of_the_members_that_went_on_without_it() -> None:
    """The simulator's seed 448 (200 s): a data-plane cut blamed the scheduler's own node a,
    and c trained on alone from 277. a asked to rejoin with its 277 while c's last heartbeat
    said 270: a looked clearly ahead, and the cluster started over from its older state. They
    trained in lockstep until a was set aside, so c, a member ever since, holds at least a's
    state: a pulls from it."""
    steps = dict.fromkeys("abc", 200)
    clock = FakeClock()
    neg = Negotiator(Scheduler("a", 1, None, clock), clock, steps.__getitem__)
    grow(neg, "a", "b", "c")
    steps.update(a=277, b=270, c=270)  # c's heartbeat lags what it holds
    for m in "abc":
        neg.observe_worker(m, "active", steps[m])
    neg.sched.step = 270
    link_failed(neg, "b", "a")
    link_failed(neg, "c", "a")  # two peers blame a
    assert neg.sched.nodes["a"].state == "standby"
    assert "c" in neg.sched.policy.members and "a" not in neg.sched.policy.members
    neg.out.clear()
    neg.join("a", neg.sched.nodes["a"].data_addr, [], step=277)
    assert not cmds(neg, "bootstrap")
    assert neg.sched.nodes["c"].state == "active"
    assert neg.sched.nodes["a"].state == "joining"
    assert "c" in neg.joins["a"].command.sources


def test_a_member_set_aside_then_unheard_may_come_back_ahead() -> None:
    """Unheard, a node set aside may have trained on under another part's scheduler: its
    newer state is judged as any joiner's again."""
    steps = dict.fromkeys("abc", 20)
    neg, _ = make(steps)
    grow(neg, "a", "b", "c")
    steps.update(a=40, b=30, c=30)
    for m in "bc":
        neg.observe_worker(m, "active", 30)
    neg.gone("a", "links-failed")
    neg.gone("a", "failure")  # then silent
    neg.join("a", neg.sched.nodes["a"].data_addr, [], step=40)
    assert [n for n, _ in cmds(neg, "bootstrap")][-1] == "a"


def test_a_cut_between_two_sites_blames_both_sides_and_is_left_to_the_partition_rule() -> None:
    """Both ends report each failed link of a cut, so every blamer is blamed in turn by
    another node: no one worker is taken for failed."""
    neg, clock = make()
    grow(neg, "a", "b", "c", "d")
    for x, y in (("a", "c"), ("b", "d"), ("a", "d"), ("b", "c")):
        neg.link(x, y, up=True)
    # Both ends of a cut link report it, at about the same time.
    for x, y in (("c", "a"), ("a", "c"), ("b", "d"), ("d", "b"), ("a", "d"), ("d", "a"),
                 ("b", "c"), ("c", "b")):
        link_failed(neg, x, y)
    assert not any(e.kind == "scale-in" for e in neg.sched.events)
    clock.advance(60)  # old blame is forgotten
    assert not neg._blame("x", "a")


def test_a_replanned_joiner_keeps_the_step_it_holds() -> None:
    """The simulator's seed 35: a joiner whose only source went was planned again as if fresh,
    and a node back from a cut with an older state started the cluster over from it."""
    neg, clock = make({"a": 281})
    grow(neg, "a")
    neg.sched.step = 280
    neg.join("b", "127.0.0.1:2", ["a"], step=281)  # b trained on to 281 elsewhere
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")  # b's source went, and no member is left
    clock.advance(SILENT_WAIT_S)  # a, silent, is not heard again
    neg.tick()
    assert neg.sched.nodes["b"].state == "active"  # b holds the newest: it starts again
    neg2, _ = make({"a": 280})  # a member at the cluster's step, as b's source
    grow(neg2, "a")
    neg2.sched.step = 280
    neg2.join("b", "127.0.0.1:2", ["a"], step=281)
    neg2.sched.set_node("a", state="standby")  # a's worker went, b still waits on it
    neg2.join("c", "127.0.0.1:3", [], step=280)  # an older holder asks meanwhile
    assert neg2.held == {"c": 280} and "b" in neg2.joins


def test_a_join_every_source_declined_is_planned_again() -> None:
    """The simulator's seed 145: the only source's memory guard declined, and the new node
    retried a pull nobody served until its own timeout."""
    neg, _ = make()
    grow(neg, "a", "b")
    neg.join("c", "127.0.0.1:3", ["a"])
    assert neg.joins["c"].command.sources == {"a": neg.sched.nodes["a"].data_addr}
    neg.out.clear()
    assert handle(neg, "a", "report", {"kind": "serve-declined", "new": "c",
                                       "reason": "memory"}) is None
    assert neg.joins["c"].command.sources == {"b": neg.sched.nodes["b"].data_addr}
    assert [n for n, _ in cmds(neg, "replicate")] == ["c", "b"]
    # The simulator's seed 1063: the rounds from c's first one on waited for c, which waited
    # for b to serve at a later step, b being in those rounds. A policy without c governs at
    # once, and c is a member only from the new plan's step on.
    without, with_c = list(neg.sched.policies)[-2:]
    assert "c" not in without.members and without.effective_step == 0
    assert "c" in with_c.members and with_c.effective_step == neg.joins["c"].member_from
    neg.out.clear()  # b declines too: no one else, so both are asked again
    handle(neg, "b", "report", {"kind": "serve-declined", "new": "c", "reason": "memory"})
    assert neg.sched.nodes["c"].state == "joining" and cmds(neg, "replicate")


def test_a_new_scheduler_hears_the_members_before_it_puts_a_joiner_ahead_of_them() -> None:
    """The simulator's seed 36: a scheduler a moment old knew a member's step only from the
    lagging snapshot, took a joiner for ahead of it, and started the cluster over from the
    joiner's state, older than the member's. It waits for their heartbeats (or
    UNHEARD_WAIT_S)."""
    steps = {"a": 505}
    neg, _ = make(steps)
    grow(neg, "a")
    neg.out.clear()
    neg.join("b", "127.0.0.1:2", [], step=515)  # ahead of what we know of a, unheard
    assert "b" not in neg.joins and not cmds(neg, "bootstrap")
    steps["a"] = 516
    neg.observe_worker("a", "active", 516)  # a's heartbeat: it is ahead, in fact
    neg.tick()
    assert neg.sched.nodes["a"].state == "active" and neg.joins["b"].command.sources == {
        "a": neg.sched.nodes["a"].data_addr}
    neg2, clock2 = make({"a": 505})
    grow(neg2, "a")
    neg2.join("b", "127.0.0.1:2", [], step=515)
    clock2.advance(UNHEARD_WAIT_S)
    neg2.tick()  # no heartbeat came: judged on what we know
    assert neg2.sched.nodes["b"].state == "active" and cmds(neg2, "bootstrap")


def emptied(silent: set[str]) -> tuple[Negotiator, FakeClock]:
    """A cluster that was at step 300 and whose only member failed; ``silent``: daemons we
    do not hear."""
    clock = FakeClock()
    neg = Negotiator(Scheduler("s", 1, None, clock), clock, lambda n: 0,
                     alive=lambda n: n not in silent)
    grow(neg, "a")
    neg.sched.step = 300
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    neg.out.clear()
    return neg, clock


def test_past_the_hold_the_best_state_held_starts_over_not_the_last_to_ask() -> None:
    """The simulator's seeds 210 and 397: a holder that went silent for a moment was dropped
    from the held (or skipped), and a fresh joiner started the cluster over beside it."""
    silent: set[str] = set()
    neg, clock = emptied(silent)
    neg.join("d", "127.0.0.1:4", [], step=279)
    silent.add("d")
    neg.sched.fail("d", "heartbeat", 2.0)
    neg.gone("d", "failure")  # d's daemon went silent: its worker may hold 279 still
    assert neg.held == {"d": 279}
    clock.advance(HOLD_S)
    neg.join("c", "127.0.0.1:3", [], step=0)  # past the hold; the best holder is silent
    assert neg.held == {"d": 279, "c": 0} and not cmds(neg, "bootstrap")
    silent.clear()  # d is back: it starts the cluster over, and c pulls from it
    neg.tick()
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["d"]
    assert neg.joins["c"].command.sources == {"d": "127.0.0.1:4"}


def test_a_holder_silent_past_two_holds_is_given_up() -> None:
    neg, clock = emptied({"d"})
    neg.sched.set_node("d", state="standby", data_addr="127.0.0.1:4")
    neg.held["d"] = 279  # held, then its daemon went silent
    neg.join("c", "127.0.0.1:3", [], step=0)
    clock.advance(HOLD_S)
    neg.tick()
    assert not cmds(neg, "bootstrap")
    clock.advance(HOLD_S)
    neg.tick()
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["c"]


def test_a_failed_link_already_dropped_blames_nobody() -> None:
    """The simulator's seed 11348: after a cut, two nodes reported links to the scheduler's
    own node that the scheduler had dropped during the cut; blamed, that member was scaled
    in, and an older state started the cluster over."""
    clock = FakeClock()
    neg = Negotiator(Scheduler("a", 1, None, clock), clock, lambda n: 0)
    grow(neg, "a")
    for node in ("b", "c"):
        neg.join(node, f"127.0.0.1:{ord(node)}", ["a"])
        neg.replicated(node, done())
    neg.link("a", "b", up=False)
    neg.link("a", "c", up=False)
    neg.link("b", "c", up=True)
    link_failed(neg, "b", "a")
    link_failed(neg, "c", "a")
    assert not any(e.kind == "scale-in" for e in neg.sched.events)


def test_the_last_members_leave_waits_until_the_new_node_holds_the_state() -> None:
    """The last member asked to leave while it was the source of a join: leaving at once, it
    took the state with it and a fresh model started the cluster over (the simulator's seed
    319). Its leave is held until the new node is a member, then goes ahead as usual."""
    neg, _ = make({"a": 40})
    grow(neg, "a")
    neg.join("b", "127.0.0.1:9", [])
    assert neg.sched.nodes["b"].state == "joining"
    before = neg.sched.policy_version
    neg.leave("a", 40)
    assert neg.sched.nodes["a"].state == "active"  # held: it serves b
    assert neg.sched.policy_version == before
    neg.tick()
    assert neg.sched.nodes["a"].state == "active"  # still held: b is pulling
    neg.replicated("b", done())
    neg.tick()
    assert neg.sched.nodes["a"].state == "left"
    assert neg.sched.policy.members == ("b",)
    assert [e.detail.get("reason") for e in neg.sched.events if e.kind == "scale-in"] == [
        "leave"]


def test_a_leaver_is_the_last_member_again_when_the_others_go_before_its_leave_took_effect(
        ) -> None:
    """a asks to leave while b is still a member, so its leave goes ahead a few steps on; b's
    worker then exits before that step. a's worker, in the rounds until then, holds the newest
    state: a is the last member again, b's worker (started again from its snapshot of 60)
    pulls a's state, and a leaves once b holds it (the simulator's seed 5955: b started the
    cluster over from 60 while a's worker held 71)."""
    steps = {"a": 71, "b": 71}
    neg, _ = make(steps)
    grow(neg, "a", "b")
    neg.observe_worker("a", "leaving", 71)
    neg.leave("a", 71)
    assert neg.sched.nodes["a"].state == "left" and neg.sched.policy.members == ("b",)
    handle(neg, "b", "worker-exit", {"code": -9})
    assert neg.sched.nodes["a"].state == "active"
    assert neg.sched.policy.members == ("a",) and neg.sched.policy.effective_step == 0
    neg.out.clear()
    neg.join("b", "127.0.0.1:9", [], step=60)
    assert not cmds(neg, "bootstrap")
    [(_, rep)] = [c for c in cmds(neg, "replicate") if c[0] == "b"]
    assert rep["sources"] == {"a": neg.sched.nodes["a"].data_addr}
    neg.replicated("b", done())
    neg.tick()
    assert neg.sched.nodes["a"].state == "left" and neg.sched.policy.members == ("b",)


def _last_member_leaving(step: int) -> Negotiator:
    """a and b train; b's worker exits, then a, the last member at ``step``, asks to leave,
    with no join in flight: its leave goes ahead a few steps on."""
    neg, _ = make({"a": step, "b": step - 5})
    grow(neg, "a", "b")
    handle(neg, "b", "worker-exit", {"code": -9})
    neg.observe_worker("a", "leaving", step)
    neg.leave("a", step)
    return neg


def test_a_joiner_that_finds_no_member_recalls_a_last_member_whose_leave_is_not_in_effect(
        ) -> None:
    """The last member a leaves the moment before b's worker (restarted, holding its
    snapshot of 220) asks to join, so the leave is not held for it: b finds no member. a's
    worker, in the rounds until its leave takes effect, holds 224: a is the last member again,
    b pulls its state, and a leaves once b holds it (the simulator's seed 9635: b started the
    cluster over from its 220)."""
    neg = _last_member_leaving(224)
    assert neg.sched.nodes["a"].state == "left" and neg.sched.policy.members == ()
    neg.out.clear()
    neg.join("b", "127.0.0.1:9", [], step=220)
    assert not cmds(neg, "bootstrap")
    assert neg.sched.nodes["a"].state == "active"
    [(_, rep)] = [c for c in cmds(neg, "replicate") if c[0] == "b"]
    assert rep["sources"] == {"a": neg.sched.nodes["a"].data_addr}
    neg.replicated("b", done())
    neg.tick()
    assert neg.sched.nodes["a"].state == "left" and neg.sched.policy.members == ("b",)


def test_a_joiner_holding_the_newer_state_does_not_recall_a_leaver() -> None:
    """A leaver whose leave is not in effect yet, holding an older state than the joiner's,
    is not recalled: the joiner's state is where the cluster goes on from."""
    neg = _last_member_leaving(224)
    neg.join("b", "127.0.0.1:9", [], step=230)
    assert neg.sched.nodes["a"].state == "left"


def test_a_straggler_aside_long_since_is_not_recalled_with_its_older_state() -> None:
    """A member set aside whose set-aside took effect long ago holds an older state than the
    members that went: it is no holder of the newest, and the cluster waits for one as ever."""
    steps = {"a": 70, "b": 70, "c": 70}
    neg, _ = make(steps)
    grow(neg, "a", "b", "c")
    neg.observe_worker("c", "active", 70)
    assert neg.stand_aside("c", "slow") is not None
    steps.update(a=500, b=500)
    neg.sched.step = 500  # the members were heard far past its set-aside
    handle(neg, "a", "worker-exit", {"code": -9})
    handle(neg, "b", "worker-exit", {"code": -9})
    assert neg.sched.nodes["c"].state == "standby" and "c" in neg.benched
    assert neg.sched.policy.members == ()


def test_a_last_members_leave_links_the_joiners_it_was_the_only_source_of() -> None:
    """The simulator's seed 20637 (60 s): the last member a served three joiners; once b held
    the state, a left, and its links went with it. c and d, members from their own step by
    then, had no link to b: the leave's policy was split, the partition rule put them aside,
    and rejoining with a newer state than the step heard of b, c started the cluster over
    from its own. The leave now links them to the others."""
    neg, _ = make({"a": 40})
    grow(neg, "a")
    for node in ("b", "c", "d"):
        neg.join(node, f"127.0.0.1:{ord(node)}", ["a"])
    neg.leave("a", 40)
    assert neg.sched.nodes["a"].state == "active"  # held: it serves the joiners
    neg.replicated("b", done())
    neg.tick()
    assert neg.sched.nodes["a"].state == "left"
    assert not any(e.kind == "partition" for e in neg.sched.events)
    assert {neg.sched.nodes[n].state for n in "cd"} == {"joining"}
    assert set(neg.sched.policy.members) == {"b", "c", "d"}
    links = {(lk.a, lk.b) for lk in neg.sched.links}
    assert ("b", "c") in links and ("b", "d") in links


def test_a_held_leave_goes_ahead_when_the_join_ends_another_way() -> None:
    neg, clock = make({"a": 40})
    grow(neg, "a")
    neg.join("b", "127.0.0.1:9", [])
    neg.leave("a", 40)
    neg.gone("b", "failure")  # the new node failed: nobody to hand the state to
    neg.tick()
    assert neg.sched.nodes["a"].state == "active"  # b may be back: waited for, briefly
    clock.advance(HAND_OVER_S)
    neg.tick()
    assert neg.sched.nodes["a"].state == "left"
    assert neg.sched.policy.members == ()


def test_the_last_members_leave_waits_briefly_for_a_node_outside_to_ask() -> None:
    """The partition rule dropped b a moment before the last member a asked to leave; b's
    join came 2 ms after the leave, which went ahead, and a's last step was lost (the
    simulator's seed 77973). A node outside with its worker attached may still ask: the
    leave waits for it, HAND_OVER_S at most, and then hands the state over."""
    neg, _ = make({"a": 18, "b": 17})
    grow(neg, "a", "b")
    neg.link("a", "b", up=False)  # the cut: b is dropped, its worker attached
    assert neg.sched.nodes["b"].state == "standby"
    neg.leave("a", 18)
    assert neg.sched.nodes["a"].state == "active"
    neg.join("b", neg.sched.nodes["b"].data_addr, [], step=17)
    assert neg.sched.nodes["b"].state == "joining"  # from a, not a start over
    assert not [e for e in neg.sched.events if e.kind == "state-lost"]
    neg.replicated("b", done())
    neg.tick()
    assert neg.sched.nodes["a"].state == "left" and neg.sched.policy.members == ("b",)


def test_a_member_with_others_leaves_at_once_even_while_it_serves() -> None:
    neg, _ = make({"a": 40, "b": 40})
    grow(neg, "a", "b")
    neg.join("c", "127.0.0.1:9", ["a"])
    neg.leave("a", 40)
    assert neg.sched.nodes["a"].state == "left"


def test_with_no_member_a_joiner_hears_the_nodes_up_before_it_starts_over() -> None:
    """The simulator's seed 107: a site came back first and its scheduler, which knew only its
    own side's step, bootstrapped its joiner 50 ms after the other site reconnected: that
    site's presence was heard, its heartbeats (a worker holding a newer state) not yet. With
    no member, a joiner waits for the heartbeats of the nodes up (or UNHEARD_WAIT_S), and a
    worker one of them holds at a newer step counts as a holder to wait for."""
    neg, clock = emptied(set())
    neg.sched.set_node("n1", state="standby", data_addr="127.0.0.1:1")  # its presence: up
    neg.join("c", "127.0.0.1:3", [], step=300)
    assert not cmds(neg, "bootstrap") and "c" not in neg.held  # n1 unheard: not judged yet
    neg.observe_worker("n1", "standby", 407)  # its worker holds step 407
    neg.tick()
    assert not cmds(neg, "bootstrap") and neg.held == {"c": 300}
    neg.join("n1", "127.0.0.1:1", [], step=407)  # its worker asks: it starts the cluster over
    clock.advance(SILENT_WAIT_S)  # (once a, the member gone silent, had its chance)
    neg.tick()
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["n1"]
    assert neg.joins["c"].command.sources == {"n1": "127.0.0.1:1"}
    # A node up whose heartbeats never come is judged on what we know, after the wait.
    # (a, the member that went silent, is waited for SILENT_WAIT_S after that.)
    neg2, clock2 = emptied(set())
    neg2.sched.set_node("n1", state="standby", data_addr="127.0.0.1:1")
    neg2.join("c", "127.0.0.1:3", [], step=300)
    clock2.advance(UNHEARD_WAIT_S)
    neg2.tick()
    clock2.advance(SILENT_WAIT_S)
    neg2.tick()
    assert [n for n, _ in cmds(neg2, "bootstrap")] == ["c"]
    # A heard node without a worker holds nothing to wait for.
    neg3, clock3 = emptied(set())
    neg3.sched.set_node("n1", state="standby", data_addr="127.0.0.1:1")
    neg3.observe_worker("n1", "standby", 407, attached=False)
    neg3.join("c", "127.0.0.1:3", [], step=300)
    clock3.advance(SILENT_WAIT_S)
    neg3.tick()
    assert [n for n, _ in cmds(neg3, "bootstrap")] == ["c"]


def power_cut(silent: set[str]) -> tuple[Negotiator, FakeClock]:
    """Members a and b trained to step 300; every box lost power. ``silent``: not back."""
    clock = FakeClock()
    neg = Negotiator(Scheduler("s", 1, None, clock), clock, lambda n: 0,
                     alive=lambda n: n not in silent)
    grow(neg, "a", "b")
    neg.sched.step = 300
    for node in ("a", "b"):
        neg.sched.fail(node, "heartbeat", 2.0)
        neg.gone(node, "failure")
    for node in {"a", "b"} - silent:  # back as new processes, their workers not started yet
        neg.sched.set_node(node, state="standby")
    neg.out.clear()
    return neg, clock


def test_after_a_power_cut_the_newest_snapshot_restores_the_cluster_at_once() -> None:
    """Every member's memory is gone (their daemons came back as new processes); each box
    says in its heartbeats the newest snapshot on its disk. The cluster goes on from the
    newest, as soon as its holder asks, with no hold, and says what was lost."""
    neg, _ = power_cut(set())
    neg.observe_worker("b", "standby", 0, attached=False, snapshot=290)
    neg.observe_worker("a", "standby", 0, attached=False, snapshot=280)
    neg.join("a", "127.0.0.1:1", [], step=280)  # a's worker first, with an older snapshot
    assert neg.held == {"a": 280} and not cmds(neg, "bootstrap")  # b's disk has a newer one
    neg.join("b", "127.0.0.1:2", [], step=290)
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["b"]
    assert neg.joins["a"].command.sources == {"b": "127.0.0.1:2"}
    [ev] = [e for e in neg.sched.events if e.kind == "state-restored"]
    assert ev.node == "b" and ev.detail["step"] == 290 and ev.detail["steps_lost"] == 10


def test_after_a_power_cut_a_member_not_back_is_waited_for() -> None:
    """b is not back: cut off rather than powered off, it may hold step 300 in memory. a's
    snapshot restores the cluster only after HOLD_S."""
    neg, clock = power_cut({"b"})
    neg.observe_worker("a", "standby", 0, attached=False, snapshot=280)
    neg.join("a", "127.0.0.1:1", [], step=280)
    assert neg.held == {"a": 280} and not cmds(neg, "bootstrap")
    clock.advance(HOLD_S)
    neg.tick()
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["a"]


def test_a_join_whose_sources_declined_or_went_is_planned_again() -> None:
    """The simulator's seed 1028: one source declined (its memory), the other's worker died,
    and the join waited on the decliner while its rounds waited on the new node."""
    neg, _ = make()
    grow(neg, "a", "b", "c")
    neg.join("d", "127.0.0.1:4", ["a", "b"])
    assert sorted(neg.joins["d"].command.sources) == ["a", "b"]
    handle(neg, "b", "report", {"kind": "serve-declined", "new": "d", "reason": "memory"})
    assert sorted(neg.joins["d"].command.sources) == ["a", "b"]  # a serves it alone
    neg.gone("a", "worker-exit")
    assert neg.joins["d"].command.sources == {"c": neg.sched.nodes["c"].data_addr}


def test_a_join_just_after_a_bootstrap_from_a_snapshot_takes_effect_past_its_step() -> None:
    """The soak after a power cut: n1 bootstrapped from its snapshot of step 2000, and n2's
    join came 17 ms later, before n1's worker had polled, so its daemon still said step 0.
    The join took effect at step 3: n1's round 2001 waited for n2, which had no state, for
    its whole timeout. A member is never behind the step it became one at."""
    neg, _ = make({"a": 0, "b": 0})  # what the daemons say before their workers poll
    neg.join("a", "127.0.0.1:1", [], step=2000)
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["a"]
    neg.join("b", "127.0.0.1:2", [], step=900)  # its own older snapshot
    [(_, rep)] = [c for c in cmds(neg, "replicate") if c[0] == "b"]
    assert rep["version_step"] >= 2000
    assert neg.sched.policy.effective_step > 2000
    neg.replicated("b", done())
    neg.join("c", "127.0.0.1:3", [])
    [(_, rep)] = [c for c in cmds(neg, "replicate") if c[0] == "c"]
    assert rep["version_step"] >= 2000  # b, a member now, is not behind its replica either


def test_a_joiner_heard_active_behind_its_replica_has_not_finished_its_join() -> None:
    """The soak: a member frozen for a few seconds was dropped and sent to rejoin; thawed,
    its heartbeat still said "active" at its old step, and that was taken for a join
    reported lost: the node was a member while its worker fetched, and the rounds waited on
    it for 300 s, until its join timed out."""
    neg, _ = make({"a": 100})
    grow(neg, "a")
    neg.join("b", "127.0.0.1:2", ["a"])
    version_step = neg.joins["b"].command.version_step
    neg.observe_worker("b", "active", version_step - 3)  # its state from before the freeze
    assert neg.sched.nodes["b"].state == "joining" and "b" in neg.joins
    neg.observe_worker("b", "active", version_step + 1)  # it did finish, report lost
    assert neg.sched.nodes["b"].state == "active" and "b" not in neg.joins


def test_a_member_set_aside_that_trained_on_under_its_old_policy_has_not_joined() -> None:
    """The e2e power cut with the broker: a member bootstrapped from an older snapshot was
    set aside when a joiner holding a newer one asked, and sent to pull from it; it trained
    on alone under its old policy, past the step of its replica, before it heard. Its
    heartbeat (active, ahead of the replica) was taken for a join whose report was lost, and
    the two lines of states were members together. Done only under the policy adding it."""
    neg, _ = make()
    neg.join("a", "127.0.0.1:1", [], step=368)
    old = neg.sched.policy_version
    neg.observe_worker("a", "active", 369, policy_version=old)  # its heartbeat
    neg.join("b", "127.0.0.1:2", [], step=380)  # clearly ahead: the cluster goes on from b
    assert neg.sched.nodes["b"].state == "active" and neg.sched.nodes["a"].state == "joining"
    command = neg.joins["a"].command
    assert command.policy_version > old
    neg.observe_worker("a", "active", command.version_step + 4, policy_version=old)
    assert neg.sched.nodes["a"].state == "joining" and "a" in neg.joins
    neg.observe_worker("a", "active", command.version_step + 1,
                       policy_version=command.policy_version)  # it did finish, report lost
    assert neg.sched.nodes["a"].state == "active" and "a" not in neg.joins


def test_a_joiner_ahead_of_the_members_but_behind_a_node_up_does_not_start_over() -> None:
    """The simulator's seed 1775: a scheduler frozen through a cut trained on alone from an
    old state; when the other site came back, a joiner holding a snapshot of step 60 was
    ahead of it and started the cluster over from 60, while a node back with it, not a
    member here yet, held step 70 in memory. The joiner pulls from the members now; the
    newer state comes with its holder's join."""
    neg, _ = make({"a": 32})
    grow(neg, "a")
    neg.sched.step = 32
    neg.observe_worker("a", "active", 32)
    neg.sched.set_node("b", state="standby", data_addr="127.0.0.1:2")
    neg.observe_worker("b", "active", 70)  # back from the cut, its worker holds step 70
    neg.out.clear()
    neg.join("c", "127.0.0.1:3", [], step=60)
    assert not cmds(neg, "bootstrap")
    assert neg.sched.nodes["c"].state == "joining" and neg.sched.nodes["a"].state == "active"
    neg.join("b", "127.0.0.1:2", [], step=70)  # b asks: the cluster goes on from its state
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["b"]


def test_after_a_power_cut_the_first_to_ask_waits_for_a_newer_snapshot_on_a_disk_up() -> None:
    """Every box back from a power cut, each with the newest snapshot of its own disk (the
    members' snapshots fall on different steps): the first to ask held 414 and started the
    cluster over at once, while a box whose worker was still starting had 416 on its disk."""
    neg, _ = make()
    for n in ("b", "c"):
        neg.sched.set_node(n, state="standby", data_addr=f"127.0.0.1:{ord(n)}")
    neg.observe_worker("b", "standby", 0, attached=False, snapshot=416)  # its heartbeat
    neg.observe_worker("c", "standby", 0, attached=False, snapshot=414)
    neg.join("c", "127.0.0.1:99", [], step=414)
    assert not cmds(neg, "bootstrap") and neg.held == {"c": 414}
    neg.join("b", "127.0.0.1:98", [], step=416)
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["b"]
    assert neg.joins["c"].command.sources == {"b": "127.0.0.1:98"}


def in_force(neg: Negotiator, step: int) -> tuple[str, ...]:
    """The members of the policy that governs round ``step``, by the workers' rule: the
    newest version whose effective step is at or before it."""
    ok = [p for p in neg.sched.policies if p.effective_step <= step]
    return max(ok, key=lambda p: p.version).members if ok else ()


def test_joiners_held_back_by_a_policy_are_each_added_at_their_own_step() -> None:
    # The simulator's seed 1721: two joiners planned at different steps, then a policy that
    # governs at once (a third join's sources all declined). Adding both back at the later
    # step dropped the earlier one out of its first round; its worker, a member by then,
    # saw itself outside the policy and asked to join again.
    steps = {"a": 10}
    neg, _ = make(steps)
    grow(neg, "a")
    neg.join("b", "127.0.0.1:2", ["a"])
    steps["a"] = 11
    neg.join("c", "127.0.0.1:3", ["a"])
    first_b, first_c = neg.joins["b"].member_from, neg.joins["c"].member_from
    assert first_b < first_c
    neg.join("d", "127.0.0.1:4", ["a"])
    neg.serve_declined("a", ServeDeclined(new="d", reason="memory"))
    for step in range(11, first_c + 3):
        members = in_force(neg, step)
        assert ("b" in members) == (step >= first_b), (step, members)
        assert ("c" in members) == (step >= first_c), (step, members)


def test_a_member_that_asks_to_join_again_is_out_of_the_rounds_until_its_replica() -> None:
    # Soak fault 12: a member whose worker saw itself outside a round asked to join again,
    # and the policy in force still named it: the rounds until its new replica's step waited
    # for a node fetching the state they were to make, until the join timed out (299 s).
    steps = {"a": 10, "b": 10}
    neg, _ = make(steps)
    grow(neg, "a", "b")
    neg.join("b", "127.0.0.1:2", ["a"], step=10)
    first = neg.joins["b"].member_from
    assert "b" not in in_force(neg, 11)
    assert "b" not in in_force(neg, first - 1)
    assert in_force(neg, first) == ("a", "b")
    # A first join is unchanged: the policy that adds a node takes effect at its step only.
    version = neg.sched.policy_version
    neg.join("c", "127.0.0.1:3", ["a"])
    assert [p.effective_step for p in neg.sched.policies if p.version > version] == [
        neg.joins["c"].member_from]


def test_a_restore_with_no_view_of_the_cluster_is_said_with_its_cost_unknown() -> None:
    """The broker lost power too: the new scheduler knows no cluster step. The first box back
    holding a snapshot restores it, and a state-restored event says so; how many steps the cut
    cost nobody knows, and the event says that rather than 0."""
    neg, _ = make()
    neg.join("a", "127.0.0.1:1", [], step=280)
    [ev] = [e for e in neg.sched.events if e.kind == "state-restored"]
    assert ev.node == "a" and ev.detail["step"] == 280 and ev.detail["steps_lost"] is None
    fresh, _ = make()
    fresh.join("a", "127.0.0.1:1", [])  # a first box with a fresh model: nothing to say
    assert not [e for e in fresh.sched.events if e.kind.startswith("state-")]


def test_a_joiner_that_cannot_reach_its_only_source_is_out_of_the_rounds_and_planned_again(
        ) -> None:
    """The soak's hour (stop 30): a partition set n1 aside; it asked to join again from n2,
    the one member left, over the link that had failed. The join's policy named n1 from its
    first round on, and n2's rounds waited for it until the join timed out (300 s)."""
    steps = {"a": 100}
    neg, _ = make(steps)
    grow(neg, "a")
    neg.join("b", "127.0.0.1:2", ["a"])
    first = neg.joins["b"].member_from
    assert "b" in in_force(neg, first)
    neg.out.clear()
    steps["a"] = first  # a reached b's first round, and waits there for it
    assert handle(neg, "b", "report", {"kind": "link-failed", "peer": "a",
                                       "reason": "network unreachable"}) is None
    assert "b" not in in_force(neg, first)  # the rounds go on without it at once
    again = neg.joins["b"]  # and it is planned again (the same source, asked again)
    assert again.member_from > first and list(again.command.sources) == ["a"]
    assert [n for n, _ in cmds(neg, "replicate")] == ["b", "a"]
    assert "b" in in_force(neg, again.member_from)
    # A link of the new node to a node that is not its source changes nothing.
    before = neg.sched.policy_version
    handle(neg, "b", "report", {"kind": "link-failed", "peer": "zz", "reason": "x"})
    assert neg.sched.policy_version == before


def test_a_repeated_join_request_says_what_the_joiner_holds_now() -> None:
    """The simulator's seed 570: a joiner restored a replica (step 148), its report came too
    late to count, and it asked again holding 148; the repeat only resent the command, the
    join kept the step of the first request (60), and when its source went it was planned
    again as holding 60: an older state (140) started the cluster over."""
    neg, _ = make({"a": 150})
    grow(neg, "a")
    neg.sched.step = 150
    neg.join("c", "127.0.0.1:3", ["a"], step=60)
    neg.join("d", "127.0.0.1:4", ["a"], step=140)
    assert neg.joins["c"].holds == 60
    neg.out.clear()
    neg.join("c", "127.0.0.1:3", ["a"], step=148)  # asked again: the command is resent
    assert [n for n, _ in cmds(neg, "replicate")] == ["c", "a"]
    assert neg.joins["c"].holds == 148
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")  # both joins lose their source: planned again, and held
    assert neg.held == {"c": 148, "d": 140}
    assert cmds(neg, "bootstrap") == []


def test_an_orphaned_join_is_planned_again_with_the_newest_step_its_heartbeat_said() -> None:
    neg, _ = make({"a": 150})
    grow(neg, "a")
    neg.sched.step = 150
    neg.join("c", "127.0.0.1:3", ["a"], step=60)
    neg.observe_worker("c", "active", 148)  # its worker holds the replica by now
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    assert neg.held == {"c": 148}


def test_a_held_joiner_the_policy_in_force_names_gets_a_policy_without_it() -> None:
    """The simulator's seed 567: a new scheduler inherited a policy naming a joiner of its
    predecessor's (it failed the predecessor, the only member, and the policy without it
    named the joiner alone). Held here as holding nothing, the joiner finished its pull from
    the thawed predecessor and trained alone on that policy, and an older state started the
    cluster over beside it. A held node is in no policy in force."""
    neg, _ = make()
    grow(neg, "a", "c")
    neg.sched.step = 212
    neg.sched.set_node("c", state="joining")  # as the retained view had it
    neg.sched.fail("a", "heartbeat", 2.0)
    neg.gone("a", "failure")
    assert neg.sched.policy is not None and neg.sched.policy.members == ("c",)
    version = neg.sched.policy_version
    neg.join("c", "127.0.0.1:3", [], step=0)  # its worker asks again, still pulling
    assert neg.held == {"c": 0}
    assert neg.sched.policy_version > version and neg.sched.policy.members == ()
    assert neg.sched.policy.effective_step == 0


def test_a_scheduler_without_the_view_asks_the_holders_under_an_unseen_policy_to_join() -> None:
    """test_split_brain: the scheduler died with its worker while the broker was down, which
    lost the retained view. Rebooted, it led again at a higher term with no view: its worker
    restored its disk's 380 and asked to join, while the survivors' workers held 396 under
    the old scheduler's policy, waiting for it. Never named by a policy of ours, they never
    asked, and past HOLD_S the older 380 started the cluster over (a fork). A policy of our
    term naming nobody makes them ask; the newest holder goes on."""
    clock = FakeClock()
    neg = Negotiator(Scheduler("a", 2, None, clock), clock, lambda n: 0)
    for node in ("a", "b", "c"):
        neg.sched.set_node(node, state="standby", data_addr=f"127.0.0.1:{ord(node)}")
    neg.observe_worker("b", "active", 396)
    neg.observe_worker("c", "active", 396)
    assert neg.sched.policy is None
    neg.join("a", "127.0.0.1:97", [], step=380)
    assert neg.held == {"a": 380} and not cmds(neg, "bootstrap")
    empty = neg.sched.policy
    assert empty is not None and empty.members == () and empty.effective_step == 0
    assert empty.version > TERM_POLICY_SPAN  # newer than every policy of term 1
    neg.join("b", "127.0.0.1:98", [], step=396)  # b's worker, outside it, asks
    neg.join("c", "127.0.0.1:99", [], step=396)
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["b"]
    assert sorted(neg.joins) == ["a", "c"] and neg.sched.step == 396
    # With a view, a held joiner the policy does not name is held quietly, as before.
    neg2, _ = make()
    grow(neg2, "x")
    neg2.sched.step = 500
    neg2.sched.fail("x", "heartbeat", 2.0)
    neg2.gone("x", "failure")
    version = neg2.sched.policy_version
    neg2.join("y", "127.0.0.1:3", [], step=0)
    assert neg2.held == {"y": 0} and neg2.sched.policy_version == version


def test_a_joiner_that_would_start_over_waits_for_the_last_member_gone_silent() -> None:
    """The simulator's seed 353: the last member's site was cut off from the broker, and its
    worker trained on unseen until its chaosd found itself deaf. When the site came back, a
    joiner of that site holding its disk's 340 asked the moment the site was back, and started
    the cluster over before the member (349) was heard. A joiner that would start over waits
    for members failed by silence to be heard again, SILENT_WAIT_S at most."""
    neg, _ = emptied(set())  # a, the only member (step 300), failed by silence
    neg.join("c", "127.0.0.1:3", [], step=340)
    assert not cmds(neg, "bootstrap") and "c" not in neg.held
    neg.sched.set_node("a", state="standby", data_addr="127.0.0.1:1")  # a's site is back
    neg.observe_worker("a", "active", 349)  # its worker trained on while cut off
    neg.tick()
    assert not cmds(neg, "bootstrap") and neg.held == {"c": 340}
    neg.join("a", "127.0.0.1:1", [], step=349)  # its worker finds itself dropped, and asks
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["a"]
    assert neg.joins["c"].command.sources == {"a": "127.0.0.1:1"}
    # A member that does not come back costs the joiner SILENT_WAIT_S, not HOLD_S.
    neg2, clock2 = emptied(set())
    neg2.join("c", "127.0.0.1:3", [], step=340)
    clock2.advance(SILENT_WAIT_S - 0.1)
    neg2.tick()
    assert not cmds(neg2, "bootstrap")
    clock2.advance(0.1)
    neg2.tick()
    assert [n for n, _ in cmds(neg2, "bootstrap")] == ["c"]
    # A member whose worker exited holds nothing in memory: nobody is waited for.
    neg3, _ = make()
    grow(neg3, "a")
    neg3.sched.step = 300
    assert handle(neg3, "a", "worker-exit", {"code": 1}) is None
    neg3.out.clear()
    neg3.join("c", "127.0.0.1:3", [], step=340)
    assert [n for n, _ in cmds(neg3, "bootstrap")] == ["c"]


def test_members_a_failure_leaves_behind_the_state_that_went_rejoin() -> None:
    """The simulator's seed 2290: a site cut off was failed, the other trained on to 260 and
    lost power. Back first after a broker restart, the cut-off site elected a scheduler that
    failed the rebooted boxes and let its two members (at 254) commit round 255 while those
    boxes asked to join holding 260. Members clearly behind the state that went rejoin, and
    the newest state held starts the cluster again."""
    steps = {"s": 254, "b": 254, "c": 260}
    neg, _ = make(steps)
    grow(neg, "s", "b", "c")
    neg.sched.step = 260  # c's last heartbeat, as the new scheduler heard it
    neg.sched.fail("c", "restarted", 0.5)
    neg.gone("c", "failure")
    assert neg.sched.nodes["s"].state == "standby" and neg.sched.nodes["b"].state == "standby"
    assert neg.sched.policy is not None and neg.sched.policy.members == ()
    neg.out.clear()
    neg.join("s", "127.0.0.1:1", [], step=254)  # our worker finds itself out, and asks
    assert neg.held == {"s": 254} and not cmds(neg, "bootstrap")
    neg.sched.set_node("c", state="standby", data_addr="127.0.0.1:3")
    neg.observe_worker("c", "joining", 260, snapshot=260)
    neg.join("c", "127.0.0.1:3", [], step=260)
    assert [n for n, _ in cmds(neg, "bootstrap")] == ["c"]
    assert neg.joins["s"].command.sources == {"c": "127.0.0.1:3"}


def test_members_level_with_the_state_that_went_train_on() -> None:
    """A member that crashes was at most a step or two ahead of the others as heard (their
    heartbeats lag): they train on. And a scheduler whose worker is not a member judges only
    on members it has heard: the snapshot's steps lag."""
    steps = {"s": 259, "b": 259, "c": 260}
    neg, _ = make(steps)
    grow(neg, "s", "b", "c")
    neg.sched.step = 260
    neg.sched.fail("c", "heartbeat", 2.0)
    neg.gone("c", "failure")
    assert neg.sched.policy is not None and neg.sched.policy.members == ("b", "s")
    steps2 = {"a": 200, "b": 200, "c": 260}
    neg2, _ = make(steps2)
    grow(neg2, "a", "b", "c")  # the scheduler "s" has no worker here
    neg2.sched.step = 260
    neg2.sched.fail("c", "heartbeat", 2.0)
    neg2.gone("c", "failure")
    assert neg2.sched.policy is not None and neg2.sched.policy.members == ("a", "b")


def test_a_joiner_holding_the_newest_step_heard_is_ahead_of_members_that_lag_it() -> None:
    """The simulator's seed 2521: a new scheduler's stale view kept the cut-off site's two
    members (n1, n4, at 330) while the other site had trained to 340 and lost power; its
    rebooted boxes asked to join holding 340. Ahead of the active members by more than the
    lead and at least the newest step heard (not that plus the lead), the joiner is where the
    cluster goes on from; a joiner holding the same state is no member to be level with."""
    steps = {"a": 330, "b": 330, "d": 340}
    clock = FakeClock()
    sched = Scheduler("s", 1, None, clock)
    neg = Negotiator(sched, clock, steps.__getitem__)
    grow(neg, "a", "b")
    neg.sched.step = 340  # the other site's last heartbeats, before it lost power
    neg.observe_worker("a", "active", 330)
    neg.observe_worker("b", "active", 330)
    neg.join("d", "127.0.0.1:4", [], step=340)  # a joiner at 340 counts as no member
    assert neg.sched.nodes["d"].state == "active", "d holds the newest state"
    assert neg.sched.nodes["a"].state == "joining" and neg.joins["a"].command.sources == {
        "d": "127.0.0.1:4"}


def test_a_node_linked_back_rejoins_holding_what_its_worker_restored() -> None:
    """The simulator's seed 2521: a rebooted box's worker restored its disk's 340 and asked
    to join; its daemon's heartbeat still said an older step until the worker's first poll,
    and a link back planned its join holding that older step."""
    clock = FakeClock()
    sched = Scheduler("s", 1, None, clock)
    said = {"a": 30, "b": 30, "c": 30, "d": 25}
    neg = Negotiator(sched, clock, said.__getitem__, reported=said.__getitem__)
    grow(neg, "a", "b", "c")
    neg.join("d", "127.0.0.1:4", ["a"])
    neg.replicated("d", done())
    neg.link("a", "d", up=False)  # d is cut off: the largest part trains on
    neg.observe_worker("d", "joining", 28)  # its worker restored 28; its daemon said 25
    neg.link("c", "d", up=True)
    assert neg.joins["d"].holds == 28


def test_a_joiners_command_names_the_policy_that_makes_it_a_member_not_a_later_one() -> None:
    # Soak fault 22: b was planned while the cluster stepped fast (a long lead), then c, a
    # node set aside by a partition, asked to join again once training had slowed (the
    # minimum lead): c becomes a member first, by one policy, and b by a later one. c's
    # command named the later one, so its source waited for that policy to govern its next
    # round before it served, and the rounds from c's first step waited for c: 101 s stalls.
    from chaos_edge.trainer.policy import PolicyBook
    from chaos_edge.trainer.scaleout import ServeMachine

    steps = {"a": 100}
    neg, clock = make(steps)
    grow(neg, "a")
    for _ in range(20):  # 40 steps/s: a lead of 20
        clock.advance(0.25)
        steps["a"] += 10
        neg.observe_progress()
    neg.join("b", "127.0.0.1:2", ["a"])
    for _ in range(30):  # a stall: the minimum lead
        clock.advance(0.25)
        neg.observe_progress()
    neg.join("c", "127.0.0.1:3", ["a"])
    b, c = neg.joins["b"].command, neg.joins["c"].command
    assert c.version_step < b.version_step
    book, source = PolicyBook(), ServeMachine("a")
    for pub in neg.sched.policies:
        book.put(pub)
    first_c = book.for_round(c.version_step + 1)
    assert first_c is not None and "c" in first_c.members and "b" not in first_c.members
    assert c.policy_version == first_c.version  # the policy that makes it a member
    for target, body in neg.out:
        if target == "a" and isinstance(body, Replicate):
            source.offer(body)
    # At c's step the source serves c (its next round needs c), and b only at b's.
    assert [r.new for r in source.due(c.version_step, book.for_round(c.version_step + 1))] \
        == ["c"]
    assert source.due(b.version_step - 1, book.for_round(b.version_step)) == []
    assert [r.new for r in source.due(b.version_step, book.for_round(b.version_step + 1))] \
        == ["b"]


def test_boxes_started_together_get_the_links_they_named_once_both_are_members() -> None:
    """Three boxes joined at once, each naming the others: the second and third were not
    members when the other asked, so only their links to the first were made, and the
    all-reduce tree had to cross whatever those two links were."""
    neg, _ = make()
    grow(neg, "a")
    neg.join("b", "127.0.0.1:2", ["a", "c"])
    neg.join("c", "127.0.0.1:3", ["a", "b"])  # b is joining: it is no source
    assert not any({lk.a, lk.b} == {"b", "c"} for lk in neg.sched.links)
    neg.replicated("b", done())
    neg.out.clear()
    neg.replicated("c", done())
    assert any({lk.a, lk.b} == {"b", "c"} for lk in neg.sched.links)
    assert sorted(n for n, _ in cmds(neg, "connect")) == ["b", "c"]  # both ends dial it
    # Removed by hand, it stays removed when an end becomes a member again.
    assert neg.link("b", "c", up=False) is None
    neg.join("c", "127.0.0.1:3", ["a"])
    neg.replicated("c", done())
    assert not any({lk.a, lk.b} == {"b", "c"} for lk in neg.sched.links)
