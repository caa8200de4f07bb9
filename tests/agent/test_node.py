"""NodeAgent on a fake bus and a fake clock: election, fencing, failures, requests, bad input.

The agent builds its real :class:`~daemon.agent.bus.Bus`, which does no I/O until ``run()``;
the tests swap it for :class:`FakeBus`, which keeps what the agent publishes in a list and
hands messages to the agent's ``on_message`` as the broker would. :class:`Fabric` joins a
few agents into a cluster on one fake clock. Time moves in 0.1 s ticks, as chaosd's main loop
does, so nothing sleeps and every test runs in well under a second.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import tempfile
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import pytest

from daemon.agent import ops
from daemon.agent.bus import Bus, Outgoing
from daemon.agent.node import JOIN_ASK_AGAIN_S, WILL_CONFIRM_S, NodeAgent
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import Config
from daemon.contracts.kinds import WORKER_REPORT_KINDS
from daemon.contracts.messages import (
    ClusterState,
    Command,
    Heartbeat,
    LeaderClaim,
    Message,
    Request,
    Status,
    Topics,
    decode,
    encode,
)
from daemon.contracts.protocol import LinkRequest

pytestmark = pytest.mark.timeout(20)
# Each agent gets a data dir of its own: chaosd keeps its election term there (TermMemory), and
# a shared one would carry a term from one test into the next.
_DATA = tempfile.TemporaryDirectory(prefix="chaos-test-node-")
_SEQ = itertools.count()
TICK_S = 0.1
T = Topics("t")


class FakeBus(Bus):
    """The agent's bus with the broker replaced by a list of what was published."""

    def __init__(self, agent: NodeAgent) -> None:
        super().__init__(agent.cfg, client_id=f"fake-{agent.me}",
                         will=Outgoing(agent.topics.status(agent.me), b"", 1, True),
                         subscriptions=[], on_message=agent.on_message,
                         on_connect=agent.on_connect, on_disconnect=agent.on_disconnect)
        self.connected = True
        self.connects = 1
        self.sent: list[Outgoing] = []
        self.own_hb = agent.topics.hb(agent.me)
        self.echo = True  # False: our heartbeats no longer come back (a cut path)

    async def publish(self, topic: str, payload: bytes, *, qos: int = 0,
                      retain: bool = False, reliable: bool = False) -> bool:
        self.sent.append(Outgoing(topic, payload, qos, retain))
        if topic == self.own_hb and self.echo:
            self._on_message(topic, payload)  # the broker echoes what we subscribe to
        return True

    def deliver(self, topic: str, msg: Message | bytes) -> None:
        """Hand one message to the agent, as the broker would."""
        self._on_message(topic, msg if isinstance(msg, bytes) else encode(msg))

    def published(self, topic: str) -> list[tuple[Outgoing, Message]]:
        return [(out, decode(out.payload)) for out in self.sent if out.topic == topic]


async def attach(node: str, clock: FakeClock) -> tuple[NodeAgent, FakeBus]:
    """A connected agent on a fake bus."""
    data_dir = os.path.join(_DATA.name, f"{node}-{next(_SEQ)}")
    agent = NodeAgent(Config(node_id=node, cluster="t", data_dir=data_dir), clock)
    bus = FakeBus(agent)
    agent.bus = bus
    await agent.on_connect()
    return agent, bus


@dataclass
class Peer:
    """A node that exists only as the messages a test hands to the agent."""

    node: str
    incarnation: int = 1
    step: int = 0
    seq: int = 0
    version: int = -1  # the policy its worker last committed a round under
    leader: str = ""  # the scheduler it follows
    state: str = "active"  # its worker's
    holds: int = -1  # the step its worker holds (-1: no worker attached)
    snapshot: int = -1  # the newest snapshot on its disk (-1: none)

    def status(self, online: bool = True, reason: str = "up") -> Status:
        return Status(node=self.node, online=online, reason=reason,
                      incarnation=self.incarnation, addr="127.0.0.1")

    def hb(self) -> Heartbeat:
        self.seq += 1
        return Heartbeat(node=self.node, seq=self.seq, incarnation=self.incarnation,
                         step=self.step, state=self.state, cpu_percent=1.0, mem_percent=2.0,
                         policy_version=self.version, leader=self.leader, holds=self.holds,
                         snapshot=self.snapshot)


async def run(agent: NodeAgent, clock: FakeClock, seconds: float,
              peers: Iterable[Peer] = ()) -> None:
    """Tick ``agent`` for ``seconds``; ``peers`` beat every 0.5 s meanwhile."""
    bus = agent.bus
    assert isinstance(bus, FakeBus)
    beating = list(peers)
    for i in range(round(seconds / TICK_S)):
        clock.advance(TICK_S)
        if i % 5 == 4:
            await agent.heartbeat()  # as chaosd's heartbeat task does (and it comes back)
            for peer in beating:
                bus.deliver(T.hb(peer.node), peer.hb())
        await agent.tick()


@dataclass
class Fabric:
    """A few agents on one fake clock; what each publishes reaches every agent (itself too)
    after its tick, except those the test has frozen (SIGSTOP: no ticks, no messages)."""

    clock: FakeClock = field(default_factory=FakeClock)
    agents: dict[str, NodeAgent] = field(default_factory=dict)
    frozen: set[str] = field(default_factory=set)
    _delivered: dict[str, int] = field(default_factory=dict)
    _ticks: int = 0

    async def add(self, *nodes: str) -> None:
        for node in nodes:
            self.agents[node], _ = await attach(node, self.clock)
            self._delivered[node] = 0
        self.pump()

    def bus(self, node: str) -> FakeBus:
        bus = self.agents[node].bus
        assert isinstance(bus, FakeBus)
        return bus

    def pump(self) -> None:
        for src in self.agents:
            if src in self.frozen:
                continue
            sent = self.bus(src).sent
            new, self._delivered[src] = sent[self._delivered[src]:], len(sent)
            for out in new:
                for dst in self.agents:
                    if dst not in self.frozen:
                        self.bus(dst).deliver(out.topic, out.payload)

    async def run(self, seconds: float) -> None:
        for _ in range(round(seconds / TICK_S)):
            self.clock.advance(TICK_S)
            self._ticks += 1
            for node, agent in self.agents.items():
                if node in self.frozen:
                    continue
                if self._ticks % 5 == 0:
                    await agent.heartbeat()
                await agent.tick()
            self.pump()

    async def attach_worker(self, node: str, port: int) -> None:
        """What ``Trainer()`` does on ``node``: worker.attach, which asks to join."""
        await ops.worker_attach(self.agents[node], {"pid": os.getpid(), "port": port,
                                                    "host": "127.0.0.1"})
        self.pump()

    def events(self, kind: str) -> list[Any]:
        leader = self.agents["a"]
        assert leader.scheduler is not None
        return [e for e in leader.scheduler.events if e.kind == kind]


def worker_ops(agent: NodeAgent, op: str) -> list[dict[str, Any]]:
    """The args of the commands of ``op`` queued for the worker, as ``worker.poll`` sends them."""
    return [cmd.to_args() for _, cmd in agent.worker.commands if op == cmd.OP]


# A lone node that knows no cluster waits a reconnect backoff more (the broker it sees empty
# may have just lost its memory): grace_s, then reconnect_max_s.
ALONE_S = Config(node_id="x", cluster="t").election.grace_s + Config(
    node_id="x", cluster="t").mqtt.reconnect_max_s


async def elected(node: str = "m") -> tuple[NodeAgent, FakeBus, FakeClock]:
    clock = FakeClock()
    agent, bus = await attach(node, clock)
    await run(agent, clock, ALONE_S + 0.5)
    assert agent.role is not None and agent.election.term == 1
    return agent, bus, clock


# --- election -----------------------------------------------------------------------------
async def test_a_lone_node_claims_after_its_grace_with_a_retained_claim_and_state() -> None:
    clock = FakeClock()
    agent, bus = await attach("a", clock)
    (status, st), = bus.published(T.status("a"))
    assert status.retain and isinstance(st, Status) and st.online
    assert [out.qos for out, _ in bus.published(T.hb("a"))] == [0]
    # grace_s (1.5): a reconnecting node hears claims first; alone and knowing no cluster, a
    # reconnect backoff more (5): an empty broker may have just lost its retained state.
    await run(agent, clock, ALONE_S - 0.1)
    assert agent.role is None and not bus.published(T.leader)
    await run(agent, clock, 0.2)
    (out, claim), = bus.published(T.leader)
    assert out.retain and out.qos == 1
    assert isinstance(claim, LeaderClaim) and (claim.id, claim.term) == ("a", 1)
    (out, snap), = bus.published(T.state)
    assert out.retain and isinstance(snap, ClusterState)
    assert (snap.leader, snap.term) == ("a", 1) and snap.nodes["a"].state == "standby"
    assert [e.kind for e in snap.events] == ["scheduler-elected"]
    assert agent.view == snap
    await run(agent, clock, 5.1)  # the retained state is refreshed even when nothing changes
    assert [s.version for _, s in bus.published(T.state)] == [1, 2]  # type: ignore[union-attr]


async def test_the_lowest_id_is_elected_and_everyone_follows() -> None:
    fab = Fabric()
    await fab.add("c", "a", "b")
    await fab.run(2.5)
    assert [n for n, ag in fab.agents.items() if ag.role is not None] == ["a"]
    assert {(ag.election.term, ag.election.leader) for ag in fab.agents.values()} == {(1, "a")}
    for node in "bc":
        view = fab.agents[node].view
        assert view is not None and (view.leader, view.term) == ("a", 1)
        assert sorted(view.nodes) == ["a", "b", "c"]


@pytest.mark.parametrize(("rival", "term"), [("z", 2), ("b", 1)])
async def test_a_better_claim_makes_the_leader_step_down(rival: str, term: int) -> None:
    agent, bus, clock = await elected("m")
    peer = Peer(rival)
    bus.deliver(T.status(rival), peer.status())
    bus.deliver(T.hb(rival), peer.hb())
    bus.deliver(T.leader, LeaderClaim(id=rival, term=term))
    assert agent.role is None and agent.scheduler is None
    assert (agent.election.term, agent.election.leader) == (term, rival)
    states = len(bus.published(T.state))
    await run(agent, clock, 6.0, [peer])
    assert len(bus.published(T.state)) == states  # no snapshot under a lost term
    assert len(bus.published(T.leader)) == 1


async def test_a_worse_claim_is_answered_by_reasserting_ours() -> None:
    agent, bus, clock = await elected("m")
    bus.deliver(T.leader, LeaderClaim(id="z", term=0))  # a stale leader, thawed
    await run(agent, clock, 0.1)
    assert agent.role is not None
    assert [(c.id, c.term) for _, c in bus.published(T.leader)] == [  # type: ignore[union-attr]
        ("m", 1), ("m", 1)]


async def test_a_tie_on_the_term_is_won_by_leading_the_next_one() -> None:
    """The simulator's seed 616: both sides of a cut elected a scheduler of term 3; the lower
    id won the tie, and a node that had obeyed the other in term 3 then obeyed the winner in
    term 3 too. The winner now claims term 4, with a policy of that term."""
    agent, bus, clock = await elected("m")
    bus.deliver(T.leader, LeaderClaim(id="z", term=1))  # the same term, a higher id
    await run(agent, clock, 0.1)
    assert agent.role is not None and agent.election.term == 2 and agent.role.term == 2
    assert [(c.id, c.term) for _, c in bus.published(T.leader)][-1] == (  # type: ignore[union-attr]
        "m", 2)


# --- commands and fencing -----------------------------------------------------------------
async def test_stale_commands_are_fenced_and_the_leaders_reach_the_worker() -> None:
    clock = FakeClock()
    agent, bus = await attach("b", clock)
    bus.deliver(T.leader, LeaderClaim(id="a", term=2))
    cmd = T.cmd("b")
    bus.deliver(cmd, Command(term=1, leader="a", seq=1, op="connect", args={"peer": "x"}))
    bus.deliver(cmd, Command(term=2, leader="z", seq=1, op="connect", args={"peer": "y"}))
    assert agent.counters["fenced"] == 2 and not agent.worker.commands
    bus.deliver(cmd, Command(term=2, leader="a", seq=2, op="connect",
                             args={"peer": "c", "addr": "127.0.0.1:7003"}))
    bus.deliver(cmd, Command(term=3, leader="a", seq=3, op="disconnect", args={"peer": "c"}))
    bus.deliver(cmd, Command(term=2, leader="a", seq=4, op="reply",
                             args={"req_id": "r1", "error": "no such peer"}))
    assert [(c["op"], c["args"]["peer"]) for c in agent.worker.drain()] == [
        ("connect", "c"), ("disconnect", "c")]
    # A reply nobody waits for is dropped: nothing accumulates.
    assert agent.counters["commands"] == 3 and agent.counters["fenced"] == 2


async def test_a_pending_reply_is_a_future_removed_when_answered_or_timed_out() -> None:
    """``ask`` waits on a future that the scheduler's reply resolves; answered or not, the
    agent keeps nothing of it afterwards (replies used to pile up, one per request)."""
    agent, bus, _ = await elected("m")
    bus.deliver(T.status("x"), Peer("x").status())
    ask = asyncio.create_task(agent.ask(LinkRequest(peer="x", action="add"), 5.0))
    await asyncio.sleep(0)  # it sends the request and waits
    (_, req), = bus.published(T.req)
    assert isinstance(req, Request) and req.reply and req.op == "link"
    bus.deliver(T.req, req)  # the scheduler (this node) answers it with a reply command
    await agent.flush()
    (_, reply), = bus.published(T.cmd("m"))
    bus.deliver(T.cmd("m"), reply)
    assert await ask is None
    assert agent._replies == {}
    with pytest.raises(TimeoutError):
        await agent.ask(LinkRequest(peer="x", action="del"), 0.05)
    assert agent._replies == {}


async def test_a_follower_ignores_requests_and_stale_snapshots() -> None:
    clock = FakeClock()
    agent, bus = await attach("b", clock)
    bus.deliver(T.leader, LeaderClaim(id="a", term=2))
    bus.deliver(T.req, Request(node="c", req_id="c-1", op="join", args={"addr": "x:1"}))
    assert agent.counters["requests"] == 0
    policy = {"version": 4, "members": ["b"]}
    bus.deliver(T.state, ClusterState(term=2, leader="a", version=7, policy=policy))
    bus.deliver(T.state, ClusterState(term=1, leader="z", version=99))  # a losing scheduler
    assert agent.view is not None and agent.view.version == 7
    assert agent.counters["stale_states"] == 1 and agent.policies == {4: policy}
    bus.deliver(T.state, ClusterState(term=2, leader="a", version=6))  # reordered, older
    assert agent.view.version == 7


async def test_a_scheduler_that_steps_down_follows_the_view_of_the_claim_it_yields_to() -> None:
    """A scheduler back from a cut hears the newer term's snapshot before its claim: it keeps
    it, and once it steps down it follows that view, not its own of the term before (the
    simulator's seed 9200: its own view, elected again, kept it training from an older state
    beside the newer term's members)."""
    agent, bus, _ = await elected("a")
    newer = {"version": 1000003, "members": ["c", "d"]}
    bus.deliver(T.state, ClusterState(term=2, leader="c", version=5, policy=newer))
    assert agent.role is not None and agent.view is not None and agent.view.term == 1
    bus.deliver(T.leader, LeaderClaim(id="c", term=2))
    assert agent.role is None
    assert agent.view is not None and (agent.view.term, agent.view.leader) == (2, "c")
    assert agent.policies[1000003] == newer


async def test_a_contest_counts_a_snapshot_on_a_peers_disk_as_a_state_it_holds() -> None:
    """A box back from a power cut holds its state on disk a moment before its worker runs
    (the simulator's seed 9013: counted as holding nothing, a scheduler back from a cut
    outbid the newer term with its older state)."""
    agent, bus, _ = await elected("a")
    rebooted = Peer("c", leader="b", state="standby", holds=-1, snapshot=380)
    bus.deliver(T.status("c"), rebooted.status())
    bus.deliver(T.hb("c"), rebooted.hb())
    assert agent.leadership.rival("b", {"c"}).step == 380


async def test_a_rebooted_node_that_knows_no_leader_yet_ignores_an_older_terms_snapshot() -> None:
    """Its term comes back from its disk, its leader does not: a snapshot of an older term is
    a stale scheduler's (one thawed after a newer term's whole life republished its view, the
    simulator's seed 7489), and one of its own term is taken."""
    clock = FakeClock()
    agent, bus = await attach("b", clock)
    agent.election.restore(2)
    assert agent.election.leader is None
    bus.deliver(T.state, ClusterState(term=1, leader="a", version=40,
                                      policy={"version": 9, "members": ["a"]}))
    assert agent.view is None and agent.counters["stale_states"] == 1
    assert agent.policies == {}
    bus.deliver(T.state, ClusterState(term=2, leader="c", version=3,
                                      policy={"version": 1000001, "members": ["b", "c"]}))
    assert agent.view is not None and agent.view.term == 2


# --- failures -----------------------------------------------------------------------------
async def test_joins_at_once_tell_the_first_node_to_bootstrap() -> None:
    """Three workers ask to join in the same instant: the first is told to start alone (a
    replicate with no source) and the others copy from it. The first used to infer its
    bootstrap from a policy naming it alone, but by the time it looked the newest policy named
    the others too, and the three waited on each other until the joins timed out."""
    fab = Fabric()
    await fab.add("a", "b", "c")
    await fab.run(2.0)
    for node, port in (("a", 7001), ("b", 7002), ("c", 7003)):
        await ops.worker_attach(fab.agents[node], {"pid": os.getpid(), "port": port,
                                                   "host": "127.0.0.1"})
    fab.pump()
    await fab.run(0.3)
    reps = {n: worker_ops(fab.agents[n], "replicate") for n in ("a", "b", "c")}
    (first,) = [n for n in ("a", "b", "c") if any(
        r["new"] == n for r in worker_ops(fab.agents[n], "bootstrap"))]
    policy = fab.agents[first].view.policy  # type: ignore[union-attr]
    assert sorted(policy["members"]) == ["a", "b", "c"]  # the newest names all three
    for node in {"a", "b", "c"} - {first}:
        (own,) = [r for r in reps[node] if r["new"] == node]
        assert list(own["sources"]) == [first]


async def test_join_requests_become_commands_and_a_silent_box_is_scaled_in() -> None:
    fab = Fabric()
    await fab.add("a", "b", "c")
    await fab.run(2.0)
    await fab.attach_worker("b", 7002)
    await fab.run(0.3)
    b, c = fab.agents["b"], fab.agents["c"]
    assert b.view is not None and b.view.policy["members"] == ["b"]
    await fab.attach_worker("c", 7003)
    await fab.run(0.3)
    assert [x["peer"] for x in worker_ops(b, "connect")] == ["c"]
    assert [x["peer"] for x in worker_ops(c, "connect")] == ["b"]
    (boot,), (rep_b,), (rep_c,) = (worker_ops(b, "bootstrap"), worker_ops(b, "replicate"),
                                   worker_ops(c, "replicate"))
    assert boot["new"] == "b"  # b bootstrapped: told to start alone
    assert rep_b == rep_c and rep_c["new"] == "c" and rep_c["sources"] == {"b": "127.0.0.1:7002"}
    assert c.view is not None and c.view.policy["members"] == ["b", "c"]
    assert c.view.nodes["c"].state == "joining" and c.view.nodes["c"].neighbors == ["b"]
    await ops.worker_report(c, {"kind": "replicated", "version": 0, "bytes": 10})
    await fab.run(0.3)
    assert c.view.nodes["c"].state == "active"
    assert fab.events("scale-out")[-1].node == "c"
    b.worker.drain()
    # c's box goes silent (SIGSTOP, a power cut): no last will, only missing heartbeats.
    fab.frozen.add("c")
    frozen_at = fab.clock.monotonic()
    for _ in range(50):
        await fab.run(TICK_S)
        if fab.events("node-failed"):
            break
    (failed,) = fab.events("node-failed")
    assert failed.node == "c" and failed.detail["reason"] == "heartbeat"
    assert 1.0 < fab.clock.monotonic() - frozen_at < 4.0  # about 2.1 s by default
    assert fab.events("scale-in")[-1].node == "c"
    await fab.run(0.2)
    assert b.view is not None and b.view.policy["members"] == ["b"]
    assert b.view.policy["effective_step"] == 0  # at once: the round in flight is rerun
    assert [x["peer"] for x in worker_ops(b, "disconnect")] == ["c"]


async def test_a_last_will_is_confirmed_before_the_node_is_failed() -> None:
    agent, bus, clock = await elected("a")
    b, c = Peer("b"), Peer("c")
    for peer in (b, c):
        bus.deliver(T.status(peer.node), peer.status())
    await run(agent, clock, 1.0, [b, c])
    bus.deliver(T.status("b"), b.status(online=False, reason="lost"))
    await run(agent, clock, WILL_CONFIRM_S - TICK_S, [c])
    assert agent.scheduler is not None and agent.scheduler.nodes["b"].state == "standby"
    await run(agent, clock, 2 * TICK_S, [c])
    assert agent.scheduler.nodes["b"].state == "failed"
    assert agent.scheduler.events[-1].detail["reason"] == "last-will"
    # A broker going away publishes every will; losing it ourselves voids the one pending.
    bus.deliver(T.status("c"), c.status(online=False, reason="lost"))
    agent.on_disconnect()
    assert agent.scheduler.nodes["c"].state == "standby"


async def test_a_heartbeat_that_arrives_after_its_daemon_left_does_not_bring_it_back() -> None:
    """CI at -n 3, test_systemd_notify: a daemon's SIGTERM leave was logged as node-failed
    (reason last-will). The heartbeat it sent just before its "left" status came after it,
    re-admitted the node as a standby, and the next judgement failed it for its offline
    presence. A beat of a process that has said it left is late news, not a return."""
    agent, bus, clock = await elected("a")
    b = Peer("b")
    bus.deliver(T.status("b"), b.status())
    await run(agent, clock, 1.0, [b])
    late = b.hb()  # sent before the leave, delivered after it
    bus.deliver(T.status("b"), b.status(online=False, reason="left"))
    bus.deliver(T.hb("b"), late)
    await run(agent, clock, 3.0)
    assert agent.scheduler is not None and agent.scheduler.nodes["b"].state == "left"
    assert not [e for e in agent.scheduler.events if e.kind == "node-failed"]
    # The same node started again (a new process: a new incarnation) is admitted as before.
    b2 = Peer("b", incarnation=2)
    bus.deliver(T.status("b"), b2.status())
    await run(agent, clock, 1.0, [b2])
    assert agent.scheduler.nodes["b"].state == "standby"


async def test_a_daemon_that_was_paused_does_not_blame_its_peers() -> None:
    agent, bus, clock = await elected("a")
    b = Peer("b")
    bus.deliver(T.status("b"), b.status())
    await run(agent, clock, 1.0, [b])
    clock.advance(5.0)  # we were frozen: b's silence is ours
    await run(agent, clock, 1.0, [b])
    assert agent.scheduler is not None and agent.scheduler.nodes["b"].state == "standby"


async def test_a_follower_paused_doubts_its_view_until_the_scheduler_speaks() -> None:
    """A pause may hide a policy that set us aside (the snapshot lost with a broker restart):
    the view is doubted from the pause until any snapshot of the scheduler we follow, the
    same version as ours included (the role, if we are elected first, acts on it)."""
    clock = FakeClock()
    agent, bus = await attach("b", clock)
    bus.deliver(T.leader, LeaderClaim(id="a", term=2))
    bus.deliver(T.state, ClusterState(term=2, leader="a", version=7))
    await run(agent, clock, 0.5)
    assert not agent.view_outdated()
    clock.advance(5.0)  # SIGSTOP, then SIGCONT
    await run(agent, clock, 0.5)
    assert agent.view_outdated()
    bus.deliver(T.state, ClusterState(term=1, leader="z", version=99))  # a losing scheduler
    assert agent.view_outdated()
    bus.deliver(T.state, ClusterState(term=2, leader="a", version=7))  # republished, as is
    assert not agent.view_outdated() and agent.view is not None and agent.view.version == 7


async def test_a_scheduler_publishing_its_own_snapshot_no_longer_doubts_its_view() -> None:
    """A doubt from a pause before our election ends with the first snapshot we publish."""
    agent, _, clock = await elected("a")
    agent.paused_since_view = True  # paused while a follower, then elected
    agent.role.sched.dirty = True  # type: ignore[union-attr]
    await run(agent, clock, 0.5)
    assert not agent.view_outdated() and agent.view is not None and agent.view.leader == "a"


async def test_a_node_that_no_longer_hears_itself_judges_nobody() -> None:
    """The broker path breaks before the connection notices (a keepalive takes seconds): our
    own heartbeats stop coming back, and the silence of everyone else is ours. Found by the
    simulator (seed 3): a scheduler cut off alone failed every follower and trained alone,
    committing the same steps as the other side."""
    agent, bus, clock = await elected("a")
    b = Peer("b")
    bus.deliver(T.status("b"), b.status())
    await run(agent, clock, 1.0, [b])
    bus.echo = False  # cut: nothing we send arrives, nothing arrives for us
    await run(agent, clock, 6.0)
    assert agent.scheduler is not None and agent.scheduler.nodes["b"].state == "standby"
    assert agent.counters["deaf"] == 1
    bus.echo = True  # the path is back, b really is gone: it is failed after its grace
    await run(agent, clock, 6.0)
    assert agent.scheduler.nodes["b"].state == "failed"


async def test_a_second_daemon_with_our_id_makes_this_one_exit() -> None:
    clock = FakeClock()
    agent, bus = await attach("a", clock)
    bus.deliver(T.status("a"), Status(node="a", online=True, reason="up",
                                      incarnation=agent.incarnation + 1))
    assert agent.should_exit and agent.exit_reason == "duplicate node id"


# --- bad input ----------------------------------------------------------------------------
MALFORMED: list[tuple[str, bytes]] = [
    (T.hb("b"), b"not json"),
    (T.hb("b"), b"[1, 2]"),
    (T.hb("b"), b'{"v": 2, "kind": "hb"}'),
    (T.hb("b"), encode(Peer("c").hb())),  # on someone else's topic
    (T.hb("b"), encode(Peer("b").status())),  # the wrong kind for the topic
    (T.hb("b"), b'{"v": 1, "kind": "hb", "node": "b", "seq": 1, "incarnation": 1, "step": 0,'
                b' "state": "dancing", "cpu_percent": 0, "mem_percent": 0}'),
    (T.hb("b"), b'{"v": 1, "kind": "hb", "node": "b", "seq": "1", "incarnation": 1,'
                b' "step": 0, "state": "active", "cpu_percent": NaN, "mem_percent": 0}'),
    (T.status("b"), b'{"v": 1, "kind": "status", "node": "b"}'),
    (T.leader, b'{"v": 1, "kind": "leader", "id": "../etc", "term": 9}'),
    (T.leader, b'{"v": 1, "kind": "leader", "id": "z", "term": -1}'),
    (T.cmd("a"), b'{"v": 1, "kind": "cmd", "term": 1, "leader": "z", "seq": 1}'),
    (T.req, b'{"v": 1, "kind": "req", "node": "b", "req_id": "r", "op": "join", "args": []}'),
    (T.state, b'{"v": 1, "kind": "state", "term": 1, "leader": "z", "version": 1,'
              b' "nodes": {"b": {"state": "bogus"}}}'),
    (T.state, b"[" * 100_000),
    (T.state, b" " * (300 * 1024)),
]


@pytest.mark.parametrize(("topic", "payload"), MALFORMED)
async def test_malformed_payloads_are_dropped_without_harm(topic: str, payload: bytes) -> None:
    agent, bus, clock = await elected("a")
    before = (agent.election.term, agent.election.leader, dict(agent.presence), agent.view)
    bus.deliver(topic, payload)
    assert agent.counters["rejected"] == 1
    assert before == (agent.election.term, agent.election.leader, dict(agent.presence),
                      agent.view)
    b = Peer("b")
    bus.deliver(T.status("b"), b.status())
    await run(agent, clock, 1.0, [b])  # and it carries on
    assert agent.scheduler is not None and agent.scheduler.nodes["b"].state == "standby"


# --- worker reports -----------------------------------------------------------------------
REPORTS: dict[str, dict[str, Any]] = {
    "link-failed": {"peer": "c", "reason": "connection reset"},
    "round-aborted": {"step": 3, "reason": "peer c failed"},
    "round-stuck": {"step": 3, "waited_s": 120.0, "reason": "last abort: peer c failed"},
    "snapshot-failed": {"reason": "/var/lib/chaos/snapshots: [Errno 28] No space left"},
    "replicated": {"version": 1, "bytes": 4096, "delay_ms": 80.0, "sources": ["b", "c"]},
    "stall": {"step": 3, "ms": 7.5, "reruns": 1, "policy_version": 1, "reason": ""},
    "serve-declined": {"new": "d", "reason": "needs 512 MiB, 100 MiB free"},
    "state-diverged": {"step": 12, "digest": "ab" * 32, "majority": "cd" * 32},
    "state-refused": {"reason": "b cannot join cluster state of step 3: model differs"},
}


def test_the_samples_cover_every_kind_a_worker_reports() -> None:
    assert sorted(REPORTS) == sorted(WORKER_REPORT_KINDS)


@pytest.mark.parametrize("kind", WORKER_REPORT_KINDS)
async def test_every_report_a_worker_sends_reaches_the_scheduler(kind: str) -> None:
    fab = Fabric()
    await fab.add("a", "b", "c", "d")
    await fab.run(2.0)
    for i, node in enumerate("bcd"):
        await fab.attach_worker(node, 7000 + i)
        await fab.run(0.3)
        if node != "d":  # d stays joining: b and c are to serve it
            await ops.worker_report(fab.agents[node], {"kind": "replicated", "version": 0})
            await fab.run(0.3)
    sender = fab.agents["d" if kind == "replicated" else "b"]
    assert await ops.worker_report(sender, {"kind": kind, **REPORTS[kind]}) == {}
    (_, req), = fab.bus(sender.me).published(T.req)[-1:]
    assert isinstance(req, Request) and req.op == "report" and req.args["kind"] == kind
    assert not req.reply  # reports are not answered
    await fab.run(0.3)
    assert sum(ag.counters["rejected"] for ag in fab.agents.values()) == 0


async def test_a_worker_is_told_when_its_daemon_is_out_of_touch() -> None:
    """The simulator's seed 1909: a scheduler alone in its policy froze; the others elected
    anew and trained on; when it thawed, its worker committed a round under its old policy
    before its daemon heard of the new term. worker.poll says whether chaosd is in touch, and
    a worker starts no round while it is not."""
    agent, _bus, clock = await elected("m")
    await ops.worker_attach(agent, {"pid": os.getpid(), "port": 7001, "host": "127.0.0.1"})
    assert ops.worker_poll(agent, {"step": 0, "state": "active"})["in_touch"]
    clock.advance(20.0)  # frozen: nothing we sent came back meanwhile
    assert not ops.worker_poll(agent, {"step": 0, "state": "active"})["in_touch"]
    await run(agent, clock, 1.0)  # a heartbeat comes back
    assert ops.worker_poll(agent, {"step": 0, "state": "active"})["in_touch"]


async def joining_worker(step: int) -> tuple[NodeAgent, FakeBus, Callable[[], int],
                                             Callable[[float], Awaitable[None]]]:
    """b, whose worker (holding ``step``) has asked a's scheduler to join: the agent, its bus,
    how many join requests went out, and ``polled(s)``: s seconds of the worker polling on."""
    clock = FakeClock()
    agent, bus = await attach("b", clock)
    bus.deliver(T.leader, LeaderClaim(id="a", term=2))  # its policies number from 1_000_001
    a = Peer("a", leader="a")
    bus.deliver(T.status("a"), a.status())

    def joins() -> int:
        return sum(1 for _, r in bus.published(T.req) if r.op == "join")  # type: ignore[union-attr]

    async def polled(seconds: float) -> None:  # the worker polls on, as a live one does
        for _ in range(round(seconds)):
            ops.worker_poll(agent, {"step": step, "state": "joining"})
            await run(agent, clock, 1.0, [a])

    await ops.worker_attach(agent, {"pid": os.getpid(), "port": 7001, "host": "127.0.0.1",
                                    "step": step})
    await run(agent, clock, 0.5, [a])
    return agent, bus, joins, polled


async def test_a_join_no_command_answered_is_asked_again_until_one_comes() -> None:
    """The simulator's seed 1112: after a power cut of every box, the workers asked the
    scheduler they remembered before it had claimed the seat again; the requests were lost,
    and the same scheduler claiming again is no new leader, so nobody asked again for a
    minute. A join no replicate or bootstrap answered goes again every JOIN_ASK_AGAIN_S."""
    _, bus, joins, polled = await joining_worker(280)
    assert joins() == 1
    await polled(JOIN_ASK_AGAIN_S + 1)
    [*_, again] = [r for _, r in bus.published(T.req) if r.op == "join"]  # type: ignore[union-attr]
    assert joins() == 2 and again.args["step"] == 280  # type: ignore[union-attr]
    bus.deliver(T.cmd("b"), Command(term=2, leader="a", seq=1, op="bootstrap",
                                    args={"new": "b", "policy_version": 1_000_003}))
    await polled(3 * JOIN_ASK_AGAIN_S)
    assert joins() == 2  # answered: never again


async def test_a_bootstrap_a_newer_policy_leaves_us_out_of_is_stale_and_the_join_is_asked_again(
) -> None:
    """The simulator's seed 2167: a box frozen with a bootstrap in its queue thawed after the
    scheduler had made another node the start (a newer policy, without it). Its worker drops
    that bootstrap (JoinMachine), and chaosd asks to join again instead of waiting for ever
    on an answer it already had."""
    agent, bus, joins, polled = await joining_worker(240)
    bus.deliver(T.cmd("b"), Command(term=2, leader="a", seq=1, op="bootstrap",
                                    args={"new": "b", "policy_version": 1_000_003}))
    bus.deliver(T.state, ClusterState(term=2, leader="a", version=7,
                                      policy={"version": 1_000_003, "members": ["b"]}))
    await polled(2 * JOIN_ASK_AGAIN_S)
    assert joins() == 1  # its own policy names it: the bootstrap stands
    bus.deliver(T.state, ClusterState(term=2, leader="a", version=8,
                                      policy={"version": 1_000_005, "members": ["c"]}))
    await polled(JOIN_ASK_AGAIN_S - 1)  # asked at once: the last ask is long past
    assert joins() == 2 and agent.worker.answer is None
    [*_, again] = [r for _, r in bus.published(T.req) if r.op == "join"]
    assert again.args["step"] == 240  # type: ignore[union-attr]
