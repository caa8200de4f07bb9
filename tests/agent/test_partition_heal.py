"""A control-plane partition heals (a bridge between two brokers is cut, then back).

While cut, each side judged the other's nodes by their silence. When the messages flow again,
that silence must not be held against a node that is plainly alive: a better leader claim and
a request are signs of life of their senders. The real thing, with two bridged mosquitto
brokers, is tests/integration/test_bridge.py; these pin the two rules on a fake bus and clock.
"""

from __future__ import annotations

import os

import pytest

from daemon.agent.node import NodeAgent
from daemon.agent.ops import worker_attach, worker_poll, worker_report
from daemon.contracts.clock import FakeClock
from daemon.contracts.errors import ControlError
from daemon.contracts.messages import ClusterState, LeaderClaim, Request
from tests.agent.test_node import FakeBus, Peer, T, attach, elected, run

pytestmark = pytest.mark.timeout(20)


async def test_a_better_claim_from_a_node_silent_in_the_partition_is_followed() -> None:
    agent, bus, clock = await elected("m")
    peer = Peer("z")
    bus.deliver(T.status("z"), peer.status())
    await run(agent, clock, 2.0, [peer])
    await run(agent, clock, 5.0)  # cut: z elected itself on its side, at a higher term
    claims = len(bus.published(T.leader))
    bus.deliver(T.leader, LeaderClaim(id="z", term=2))  # healed: its claim comes over
    assert agent.role is None and agent.election.leader == "z"
    await run(agent, clock, 0.4)  # before z's next heartbeat comes over
    assert (agent.election.term, agent.election.leader) == (2, "z")
    assert len(bus.published(T.leader)) == claims, "stood against a leader it just followed"
    await run(agent, clock, 5.0, [peer])
    assert agent.role is None and agent.election.leader == "z"


async def test_a_node_silent_in_the_partition_that_asks_to_join_is_not_failed_at_once() -> None:
    agent, bus, clock = await elected("m")
    peer = Peer("z")
    bus.deliver(T.status("z"), peer.status())
    await run(agent, clock, 2.0, [peer])
    await run(agent, clock, 5.0)  # cut: the scheduler fails z by its silence
    sched = agent.scheduler
    assert sched is not None
    failed = [e for e in sched.events if e.kind == "node-failed" and e.node == "z"]
    assert len(failed) == 1
    # Healed: z's worker asks to rejoin before z's next heartbeat comes over.
    bus.deliver(T.req, Request(node="z", req_id="z-1-1", op="join",
                               args={"addr": "127.0.0.1:7002", "neighbors": [], "rtts": {}}))
    await run(agent, clock, 0.4)
    assert [e.node for e in sched.events if e.kind == "node-failed"] == ["z"]
    assert sched.nodes["z"].state in ("joining", "active")


async def test_a_join_asked_of_a_scheduler_whose_term_ended_is_asked_of_the_new_one() -> None:
    # The site's scheduler was cut off: its own worker, dropped by the other side, asked it
    # to rejoin. Healed, it steps down; the new scheduler never heard that request, and the
    # worker would wait out its whole join timeout (test_bridge.py once did, for 60 s).
    agent, bus, clock = await elected("m")
    peer = Peer("z")
    bus.deliver(T.status("z"), peer.status())
    await run(agent, clock, 2.0, [peer])
    await worker_attach(agent, {"port": 7001, "pid": os.getpid(), "host": "127.0.0.1"})

    def joins() -> list[Request]:
        return [r for _, r in bus.published(T.req) if isinstance(r, Request) and r.op == "join"]

    assert len(joins()) == 1
    bus.deliver(T.leader, LeaderClaim(id="z", term=2))
    await agent.flush()
    assert agent.role is None and len(joins()) == 2
    assert joins()[-1].args["addr"] == "127.0.0.1:7001"
    bus.deliver(T.leader, LeaderClaim(id="z", term=2))  # the same leader again: no new ask
    await agent.flush()
    assert len(joins()) == 2


async def test_the_scheduler_of_the_larger_part_outbids_a_newer_term() -> None:
    """Two nodes train under m's policies, one under z's (the other side of a healed cut,
    which elected a newer term): m restates its claim, counts for contest_s, and claims a
    term above z's, with a policy of that term that leaves z's side to rejoin."""
    agent, bus, clock = await elected("m")
    peers = [Peer("p"), Peer("q")]
    for peer in peers:
        bus.deliver(T.status(peer.node), peer.status())
    await run(agent, clock, 1.0, peers)
    for i, peer in enumerate(peers):
        bus.deliver(T.req, Request(node=peer.node, req_id=f"{peer.node}-1", op="join",
                                   args={"addr": f"127.0.0.1:{7002 + i}", "neighbors": [],
                                         "rtts": {}}))  # fmt: skip
        await run(agent, clock, 0.2, peers)
    sched = agent.scheduler
    assert sched is not None and sched.policy is not None
    for peer in peers:
        peer.version = sched.policy.version  # they commit rounds under m's newest policy...
        peer.leader = "m"  # ...following m
    await run(agent, clock, 1.0, peers)
    assert agent.leadership.training_count() == 2
    claims = len(bus.published(T.leader))
    bus.deliver(T.leader, LeaderClaim(id="z", term=2, training=1))
    assert agent.role is not None and agent.election.leader == "m"
    await agent.flush()
    restated = [c for _, c in bus.published(T.leader)][claims:]
    assert [(c.id, c.term, c.training) for c in restated] == [("m", 1, 2)]
    await run(agent, clock, 1.2, peers)
    assert agent.role is not None and agent.election.term == 3 and agent.role.term == 3
    last = bus.published(T.leader)[-1][1]
    assert (last.id, last.term, last.training) == ("m", 3, 2)
    assert sched.policy.version > 2 * 1_000_000  # above anything z's term numbered
    outbid = [e for e in sched.events if e.kind == "scheduler-elected" and e.term == 3]
    assert outbid and outbid[0].detail["contest"] == {"own": 2, "rival": 1}


async def test_a_stale_scheduler_steps_down_when_it_hears_the_newer_term_hold_a_newer_state(
        ) -> None:  # fmt: skip
    """The simulator's seed 1127: m led term 1, froze through a cut, and came back after a
    broker restart to reclaim it; the others had followed z in term 2 and trained on to step
    7. z, back a moment later, claimed with nobody heard yet (step 0). On that word m's own
    worker (step 3) looked the newer state: m outbid z, and its policy of term 3 had its
    worker rebuild round 4. m hears z's followers hold step 7 itself: it steps down at once."""
    agent, bus, clock = await elected("m")
    await worker_attach(agent, {"port": 7001, "pid": os.getpid(), "host": "127.0.0.1",
                                "step": 3})
    worker_poll(agent, {"step": 3, "state": "active"})
    peers = [Peer(n, step=7, leader="z", state="joining", holds=7) for n in ("p", "q")]
    for peer in peers:
        bus.deliver(T.status(peer.node), peer.status())
    await run(agent, clock, 1.0, peers)
    assert agent.role is not None and agent.leadership.training() == (1, 3)
    bus.deliver(T.leader, LeaderClaim(id="z", term=2, training=0, step=0))
    assert agent.role is None and (agent.election.term, agent.election.leader) == (2, "z")


async def test_a_scheduler_outnumbered_by_the_claim_steps_down_at_once() -> None:
    agent, bus, _ = await elected("m")
    bus.deliver(T.leader, LeaderClaim(id="z", term=2, training=3))
    assert agent.role is None and agent.election.leader == "z"


async def test_a_follower_holds_on_to_its_live_leader_and_then_takes_the_held_snapshot(
        ) -> None:  # fmt: skip
    clock = FakeClock()
    agent, bus = await attach("f", clock)
    s = Peer("s")
    bus.deliver(T.status("s"), s.status())
    bus.deliver(T.leader, LeaderClaim(id="s", term=1))
    bus.deliver(T.state, ClusterState(term=1, leader="s", version=3))
    await run(agent, clock, 2.0, [s])
    assert agent.election.leader == "s"
    bus.deliver(T.leader, LeaderClaim(id="z", term=2, training=1))
    bus.deliver(T.state, ClusterState(term=2, leader="z", version=9))
    await run(agent, clock, 1.0, [s])
    # s is alive and may outbid z: f stays with it and keeps its snapshot.
    assert agent.election.leader == "s" and agent.view is not None
    assert (agent.view.leader, agent.view.version) == ("s", 3)
    await run(agent, clock, 1.2, [s])  # s did not outbid within two windows: follow z
    assert agent.election.leader == "z" and agent.view is not None
    assert (agent.view.leader, agent.view.version) == ("z", 9)


async def test_heartbeats_name_the_policy_the_worker_last_committed_under() -> None:
    agent, bus, _ = await elected("m")
    await worker_attach(agent, {"port": 7001, "pid": os.getpid(), "host": "127.0.0.1"})
    await agent.heartbeat()
    assert bus.published(T.hb("m"))[-1][1].policy_version == -1  # nothing committed yet
    worker_poll(agent, {"step": 3, "state": "active", "policy_version": 7,
                        "committed_version": 5})  # fmt: skip
    worker_poll(agent, {"step": 4, "state": "active", "policy_version": 7})  # an older worker
    await agent.heartbeat()
    assert bus.published(T.hb("m"))[-1][1].policy_version == 5
    with pytest.raises(ControlError, match="committed_version"):
        worker_poll(agent, {"step": 4, "state": "active", "committed_version": -3})


async def test_heartbeats_carry_the_workers_compute_and_vector_size() -> None:
    """The policy controller's inputs (issue 24): a step's own compute and the elements a
    round all-reduces, as the worker's polls say them; unknown (-1) until it does."""
    agent, bus, _ = await elected("m")
    await worker_attach(agent, {"port": 7001, "pid": os.getpid(), "host": "127.0.0.1"})
    await agent.heartbeat()
    hb = bus.published(T.hb("m"))[-1][1]
    assert (hb.compute_ms, hb.elements) == (-1.0, -1)
    worker_poll(agent, {"step": 3, "state": "active", "compute_ms": 42.5, "elements": 9000})
    await agent.heartbeat()
    hb = bus.published(T.hb("m"))[-1][1]
    assert (hb.compute_ms, hb.elements, hb.cannot_diloco) == (42.5, 9000, "")
    # A worker that cannot run DiLoCo's local steps says why; the heartbeat carries it.
    worker_poll(agent, {"step": 4, "state": "active", "compute_ms": 40.0, "elements": 9000,
                        "cannot_diloco": "diloco mode does not support a GradScaler"})
    await agent.heartbeat()
    assert "GradScaler" in bus.published(T.hb("m"))[-1][1].cannot_diloco
    with pytest.raises(ControlError, match="compute_ms"):
        worker_poll(agent, {"step": 4, "state": "active", "compute_ms": "fast"})


async def test_a_contesting_scheduler_holds_requests_until_the_contest_is_decided() -> None:
    """While a better claim holds our seat in doubt we act on nothing; the requests that came
    meanwhile are done if we win and handed to the winner if we lose. Found by the simulator
    (seed 3): a scheduler back from a cut, contesting a claim whose count was stale, scaled
    the others in on its own worker's link reports and let it train alone."""
    agent, bus, clock = await elected("m")
    peer = Peer("p")
    bus.deliver(T.status("p"), peer.status())
    await run(agent, clock, 1.0, [peer])
    bus.deliver(T.req, Request(node="p", req_id="p-1", op="join",
                               args={"addr": "127.0.0.1:7002", "neighbors": [], "rtts": {}}))
    await run(agent, clock, 0.2, [peer])
    sched = agent.scheduler
    assert sched is not None and sched.policy is not None
    peer.version, peer.leader = sched.policy.version, "m"
    await run(agent, clock, 1.0, [peer])
    assert agent.leadership.training_count() == 1
    version = sched.policy_version
    assert agent.in_touch()
    bus.deliver(T.leader, LeaderClaim(id="z", term=2, training=0))  # a stale count: contest
    assert agent.election.contested is not None
    assert not agent.in_touch()  # no round starts while the seat is in doubt (seed 2855)
    bus.deliver(T.req, Request(node="p", req_id="p-2", op="leave", args={"step": 3}))
    await run(agent, clock, 0.3, [peer])
    assert sched.policy_version == version and sched.nodes["p"].state == "active"
    bus.deliver(T.leader, LeaderClaim(id="z", term=2, training=5))  # the fresh count wins
    await run(agent, clock, 1.5, [peer])
    assert agent.role is None and agent.election.leader == "z"
    assert sched.policy_version == version  # the leave was never done here...
    forwarded = [r for _, r in bus.published(T.req) if isinstance(r, Request)]
    assert [(r.node, r.req_id) for r in forwarded][-1:] == [("p", "p-2")]  # ...but passed on


async def back_from_a_long_cut(joined: bool) -> tuple[NodeAgent, FakeBus, FakeClock, Peer]:
    """m schedules p (a member if ``joined``); cut off for 10 s (its heartbeats stop coming
    back, p is not heard), it is back after a broker restart."""
    agent, bus, clock = await elected("m")
    peer = Peer("p")
    bus.deliver(T.status("p"), peer.status())
    await run(agent, clock, 1.0, [peer])
    if joined:
        bus.deliver(T.req, Request(node="p", req_id="p-1", op="join",
                                   args={"addr": "127.0.0.1:7002", "neighbors": [], "rtts": {}}))
        await run(agent, clock, 0.5, [peer])
        sched = agent.scheduler
        assert sched is not None and sched.nodes["p"].state in ("joining", "active")
    bus.echo = False
    await run(agent, clock, 10.0)
    agent.on_disconnect()
    bus.echo, bus.connects = True, 2
    await agent.on_connect()
    return agent, bus, clock, peer


async def test_a_scheduler_back_from_a_long_cut_acts_on_nothing_until_it_hears_its_nodes(
        ) -> None:
    """The simulator's seed 635: a scheduler cut off for 18 s came back after a broker restart
    that had lost the other side's claim, and at once scaled in a node of that side on its
    own old link reports; its one member committed round 21 on step 20 while the other side,
    under a newer term, held 34. Back from a long cut, it holds its seat in doubt until the
    nodes it schedules are heard; a heartbeat naming a later term's policy is that claim."""
    agent, bus, clock, peer = await back_from_a_long_cut(joined=True)
    sched = agent.scheduler
    assert sched is not None
    version = sched.policy_version
    bus.deliver(T.req, Request(node="m", req_id="m-9", op="report",
                               args={"kind": "link-failed", "peer": "p", "reason": "reset"}))
    await run(agent, clock, 0.5)
    assert sched.policy_version == version, "acted before it heard p"
    # p's heartbeat: it trained under a term-2 policy, led by z, a claim we never heard.
    peer.version, peer.leader, peer.step, peer.holds = 1_000_009, "z", 34, 34
    await run(agent, clock, 0.5, [peer])
    assert agent.role is None and (agent.election.term, agent.election.leader) == (2, "z")
    assert sched.policy_version == version  # the stale report was never acted on here...
    forwarded = [r for _, r in bus.published(T.req) if isinstance(r, Request)]
    assert ("m", "m-9") in [(r.node, r.req_id) for r in forwarded]  # ...but passed on


async def test_a_scheduler_back_from_a_long_cut_acts_once_its_nodes_are_heard() -> None:
    """The hold ends as soon as every node it schedules is heard (here at the same term),
    and the requests that waited are done then."""
    agent, bus, clock, peer = await back_from_a_long_cut(joined=False)
    bus.deliver(T.req, Request(node="p", req_id="p-1", op="join",
                               args={"addr": "127.0.0.1:7002", "neighbors": [], "rtts": {}}))
    await run(agent, clock, 0.3)
    sched = agent.scheduler
    assert sched is not None and sched.nodes["p"].state not in ("joining", "active")
    await run(agent, clock, 0.6, [peer])
    assert agent.role is not None and sched.nodes["p"].state in ("joining", "active")


async def test_a_worker_that_reports_its_replica_is_said_to_hold_it_before_its_next_poll(
        ) -> None:
    """The simulator's seed 2153: a box frozen while it pulled thawed with the replica of
    577; its heartbeat still said the 540 of its disk until the worker's next poll, and a
    scheduler with no member took a holder of 560 for the newest and started over from it."""
    agent, bus = await attach("j", FakeClock())
    await worker_attach(agent, {"pid": os.getpid(), "port": 7009, "step": 540})
    await agent.heartbeat()
    assert bus.published(T.hb("j"))[-1][1].holds == 540
    await worker_report(agent, {"kind": "replicated", "version": 577})
    await agent.heartbeat()
    hb = bus.published(T.hb("j"))[-1][1]
    assert (hb.step, hb.holds) == (577, 577)


async def test_a_scheduler_back_from_a_long_cut_judges_statuses_after_its_hold() -> None:
    """The simulator's seed 2521: back from a long cut, a scheduler failed the other side's
    rebooted boxes on their statuses at once, and the policy without them let its own stale
    members train. Statuses that come during the hold are judged when it ends."""
    agent, bus, clock, peer = await back_from_a_long_cut(joined=True)
    sched = agent.scheduler
    assert sched is not None
    version = sched.policy_version
    peer.incarnation += 1  # p rebooted meanwhile
    bus.deliver(T.status("p"), peer.status())
    await run(agent, clock, 0.3)
    assert sched.nodes["p"].state in ("joining", "active") and sched.policy_version == version
    await run(agent, clock, 0.6, [peer])  # p heard: the hold ends, its status is judged
    assert [e.detail.get("reason") for e in sched.events
            if e.kind == "node-failed" and e.node == "p"] == ["restarted"]


async def test_the_poll_says_the_term_chaosd_knows() -> None:
    """A worker drops a bootstrap of an ended term (seed 2759): the poll says the term."""
    agent, _bus, _clock = await elected("m")
    await worker_attach(agent, {"pid": os.getpid(), "port": 7009, "step": 0})
    assert worker_poll(agent, {"step": 0, "state": "joining"})["term"] == agent.election.term == 1
