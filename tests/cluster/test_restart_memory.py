"""What a node keeps across restarts (the soak's split brain), with a fake clock and no I/O
beyond a temp dir: the term in the data dir, the wait of a node that remembers a cluster but
holds none of its state, and the scale-in of a member whose process restarted unannounced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.agent.memory import TermMemory
from daemon.agent.node import NodeAgent
from daemon.cluster.election import Action, Election, Holding
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import Config, ElectionConfig
from daemon.contracts.messages import Status
from daemon.contracts.snapshots import SNAPSHOT_DIR, snapshot_name
from tests.cluster.test_role import FakeHost, join

pytestmark = pytest.mark.timeout(10)
CFG = ElectionConfig(stagger_s=0.3, grace_s=1.5, orphan_s=10.0)


def test_memory_keeps_the_best_term_per_cluster(tmp_path: Path) -> None:
    missing = TermMemory(str(tmp_path / "missing"), "c1")
    missing.save(3, "n1")  # logged, not raised; and the data dir is not ours to create
    assert not (tmp_path / "missing").exists()
    (tmp_path / "d").mkdir()
    mem = TermMemory(str(tmp_path / "d"), "c1")
    assert mem.load() == 0
    mem.save(3, "n1")
    mem.save(2, "n2")  # never goes back
    assert json.loads((tmp_path / "d" / "election.json").read_text()) == {
        "cluster": "c1", "term": 3, "leader": "n1"}
    assert TermMemory(str(tmp_path / "d"), "c1").load() == 3
    assert TermMemory(str(tmp_path / "d"), "other").load() == 0  # another cluster's file
    (tmp_path / "d" / "election.json").write_text("{not json")
    assert TermMemory(str(tmp_path / "d"), "c1").load() == 0  # unreadable: start fresh


def test_a_node_that_remembers_a_cluster_waits_for_its_state() -> None:
    clock = FakeClock()
    el = Election("a", CFG, clock)
    el.restore(7)
    el.connected()
    clock.advance(CFG.grace_s)
    # Rank 0, seat vacant, but no snapshot to start from: a peer that has one goes first.
    assert el.tick({"b"}, holding=Holding.NOTHING).action is Action.NONE
    assert el.on_claim("b", 8).action is Action.FOLLOW
    assert el.leader == "b" and el.term == 8


def test_an_orphan_stands_above_its_remembered_term_in_the_end() -> None:
    clock = FakeClock()
    el = Election("a", CFG, clock)
    el.restore(7)
    el.connected()
    clock.advance(CFG.grace_s)
    assert el.tick(set(), holding=Holding.NOTHING).action is Action.NONE
    clock.advance(CFG.orphan_s - 0.1)
    assert el.tick(set(), holding=Holding.NOTHING).action is Action.NONE
    clock.advance(0.2)
    verdict = el.tick(set(), holding=Holding.NOTHING)
    assert verdict.action is Action.CLAIM and verdict.term == 8


def test_a_fresh_node_does_not_wait() -> None:
    clock = FakeClock()
    el = Election("a", CFG, clock)
    el.connected()
    clock.advance(CFG.grace_s)
    assert el.tick(set(), holding=Holding.NOTHING).action is Action.CLAIM


def test_a_member_back_as_a_new_process_is_scaled_in_then_admitted() -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "1", "2")
    assert role.sched.nodes["1"].state == "active"
    version = role.sched.policy_version
    # "1" crashed while the broker was away (no will) and came back: a higher incarnation.
    role.on_status(Status(node="1", online=True, reason="up", incarnation=2, addr="10.0.0.1"))
    failed = [e for e in role.sched.events if e.kind == "node-failed"]
    assert [(e.node, e.detail["reason"]) for e in failed] == [("1", "restarted")]
    assert role.sched.nodes["1"].state == "standby" and role.sched.nodes["1"].incarnation == 2
    assert role.sched.policy_version > version
    assert "1" not in (role.sched.policy.members if role.sched.policy else [])


def test_a_newcomer_that_sees_a_peer_knowing_a_cluster_lets_it_lead_first() -> None:
    """The simulator's seed 66: the broker restarted and lost the retained claim and snapshot;
    a new box, remembering nothing, stood at once and bootstrapped a fresh model beside the
    peers that held the state. A peer's presence says which term it knew: above 0, a cluster
    exists, and the newcomer waits orphan_s for one of its members to lead."""
    clock = FakeClock()
    el = Election("z", CFG, clock)
    el.connected()
    clock.advance(CFG.grace_s)
    assert el.tick({"a"}, holding=Holding.NOTHING, cluster_term=3).action is Action.NONE
    assert el.on_claim("a", 4).action is Action.FOLLOW
    fresh = Election("z", CFG, clock)  # peers that know no cluster: a new one, no wait
    fresh.connected()
    clock.advance(CFG.grace_s)  # rank 1: after a's turn
    assert fresh.tick({"a"}, holding=Holding.NOTHING, cluster_term=0).action is Action.NONE
    clock.advance(CFG.stagger_s + 0.05)
    assert fresh.tick({"a"}, holding=Holding.NOTHING, cluster_term=0).action is Action.CLAIM


def test_a_node_holds_the_state_when_its_disk_or_worker_does(tmp_path: Path) -> None:
    """After a power cut of every box and the broker, no node has the retained view; the
    disks hold the state. Counted as holding none, every node waited orphan_s, and each
    broker restart began that wait again: training resumed 96 s after the daemons returned
    (the soak's hour in stop 34). A snapshot on our disk, or a worker holding a state, is a
    state a scheduler elected here can start from."""
    agent = NodeAgent(Config(node_id="n1", cluster="c", data_dir=str(tmp_path)), FakeClock())
    assert agent.view is None and agent._start_from() is Holding.NOTHING  # a new box: waits
    (tmp_path / SNAPSHOT_DIR).mkdir()
    (tmp_path / SNAPSHOT_DIR / snapshot_name(240)).touch()
    assert agent._start_from() is Holding.STATE
    (tmp_path / SNAPSHOT_DIR / snapshot_name(240)).unlink()
    agent.worker.pid, agent.worker.step = 4242, 17  # a worker attached, holding step 17
    assert agent._start_from() is Holding.STATE
    agent.worker.step = 0  # a fresh model is no state
    assert agent._start_from() is Holding.NOTHING


def test_a_holder_of_a_state_stands_after_the_view_and_long_before_orphan_s() -> None:
    """A node whose disk or worker holds the state, without the view, stands once every live
    node had its turn: a node with the view leads first (a scheduler without it makes every
    worker join again), and after a power cut of every box, when no node has the view, the
    holders do not wait orphan_s (test_split_brain and the soak's hour of stop 34)."""
    clock = FakeClock()
    held = Election("a", CFG, clock)  # rank 0 among a, b, c, but only its disk holds a state
    viewer = Election("b", CFG, clock)  # rank 1, with the view
    for el in (held, viewer):
        el.restore(3)
        el.connected()
    clock.advance(CFG.grace_s)
    assert held.tick({"b", "c"}, holding=Holding.STATE).action is Action.NONE
    assert viewer.tick({"a", "c"}, holding=Holding.VIEW).action is Action.NONE
    clock.advance(CFG.stagger_s + 0.01)  # b's turn
    assert held.tick({"b", "c"}, holding=Holding.STATE).action is Action.NONE
    assert viewer.tick({"a", "c"}, holding=Holding.VIEW).action is Action.CLAIM
    # Nobody with the view: after every live node's turn, long before orphan_s.
    lone = Election("a", CFG, clock)
    lone.restore(3)
    lone.connected()
    clock.advance(CFG.grace_s)
    assert lone.tick({"b", "c"}, holding=Holding.STATE).action is Action.NONE
    clock.advance(3 * CFG.stagger_s + 0.05)
    assert 3 * CFG.stagger_s < CFG.orphan_s
    verdict = lone.tick({"b", "c"}, holding=Holding.STATE)
    assert verdict.action is Action.CLAIM and verdict.term == 4
    # And two reconnect backoffs: after a broker restart a live scheduler may still be
    # reconnecting (the hour of stop 35: a node that stood seeing nobody forked the state).
    backoff = 2.0
    late = Election("a", CFG, clock)
    late.restore(3)
    late.connected()
    clock.advance(CFG.grace_s)
    assert late.tick(set(), holding=Holding.STATE, alone_s=backoff).action is Action.NONE
    clock.advance(2 * backoff - 0.1)
    assert late.tick(set(), holding=Holding.STATE, alone_s=backoff).action is Action.NONE
    assert late.on_claim("b", 4).action is Action.FOLLOW  # the scheduler is back: followed
    alone = Election("a", CFG, clock)
    alone.restore(3)
    alone.connected()
    clock.advance(CFG.grace_s)
    assert alone.tick(set(), holding=Holding.STATE, alone_s=backoff).action is Action.NONE
    clock.advance(2 * backoff + 0.05)
    assert 2 * backoff < CFG.orphan_s
    assert alone.tick(set(), holding=Holding.STATE, alone_s=backoff).action is Action.CLAIM
