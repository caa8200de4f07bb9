"""What a node keeps across restarts (the soak's split brain), with a fake clock and no I/O
beyond a temp dir: the term in the data dir, the wait of a node that remembers a cluster but
holds none of its state, and the scale-in of a member whose process restarted unannounced."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from daemon.agent.memory import TermMemory
from daemon.cluster.election import Action, Election
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import ElectionConfig
from daemon.contracts.messages import Status
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
    assert el.tick({"b"}, has_state=False).action is Action.NONE
    assert el.on_claim("b", 8).action is Action.FOLLOW
    assert el.leader == "b" and el.term == 8


def test_an_orphan_stands_above_its_remembered_term_in_the_end() -> None:
    clock = FakeClock()
    el = Election("a", CFG, clock)
    el.restore(7)
    el.connected()
    clock.advance(CFG.grace_s)
    assert el.tick(set(), has_state=False).action is Action.NONE
    clock.advance(CFG.orphan_s - 0.1)
    assert el.tick(set(), has_state=False).action is Action.NONE
    clock.advance(0.2)
    verdict = el.tick(set(), has_state=False)
    assert verdict.action is Action.CLAIM and verdict.term == 8


def test_a_fresh_node_does_not_wait() -> None:
    clock = FakeClock()
    el = Election("a", CFG, clock)
    el.connected()
    clock.advance(CFG.grace_s)
    assert el.tick(set(), has_state=False).action is Action.CLAIM


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
    assert el.tick({"a"}, has_state=False, cluster_term=3).action is Action.NONE
    assert el.on_claim("a", 4).action is Action.FOLLOW
    fresh = Election("z", CFG, clock)  # peers that know no cluster: a new one, no wait
    fresh.connected()
    clock.advance(CFG.grace_s)
    assert fresh.tick({"a"}, has_state=False, cluster_term=0).action is Action.NONE  # rank 1
    clock.advance(CFG.stagger_s + 0.05)
    assert fresh.tick({"a"}, has_state=False, cluster_term=0).action is Action.CLAIM
