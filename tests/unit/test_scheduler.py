"""Scheduler state transitions, with a fake clock."""

from __future__ import annotations

import pytest

from daemon.cluster.scheduler import FORGET_AFTER_S, Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.messages import Heartbeat, Status, decode, encode

pytestmark = pytest.mark.timeout(30)


def status(node: str, online: bool, reason: str = "up", inc: int = 1) -> Status:
    return Status(node=node, online=online, reason=reason, incarnation=inc, addr="127.0.0.1")


def hb(node: str, inc: int = 1, step: int = 0) -> Heartbeat:
    return Heartbeat(node=node, seq=1, incarnation=inc, step=step, state="standby",
                     cpu_percent=0.0, mem_percent=0.0)


def test_presence_failure_and_return() -> None:
    clock = FakeClock()
    s = Scheduler("a", 1, None, clock)
    s.observe_status(status("b", True))
    assert s.nodes["b"].state == "standby"
    assert s.observe_status(status("b", False, "lost")) == "lost"
    s.fail("b", "last-will", None)
    assert s.nodes["b"].state == "failed"
    ev = s.events[-1]
    assert ev.kind == "node-failed" and ev.node == "b" and ev.detail["reason"] == "last-will"
    s.fail("b", "heartbeat", 2.0)  # already failed: no second event
    assert sum(e.kind == "node-failed" for e in s.events) == 1
    s.observe_heartbeat(hb("b", inc=2))  # restarted process
    assert s.nodes["b"].state == "standby" and s.nodes["b"].incarnation == 2


def test_stale_incarnation_news_is_ignored() -> None:
    s = Scheduler("a", 1, None, FakeClock())
    s.observe_status(status("b", True, inc=5))
    assert s.observe_status(status("b", False, "lost", inc=4)) is None
    assert s.nodes["b"].state == "standby"


def test_graceful_leave_is_not_a_failure() -> None:
    s = Scheduler("a", 1, None, FakeClock())
    s.observe_status(status("b", True))
    assert s.observe_status(status("b", False, "left")) == "left"
    assert s.nodes["b"].state == "left"
    assert not [e for e in s.events if e.kind == "node-failed"]


def test_new_scheduler_resumes_from_snapshot() -> None:
    clock = FakeClock()
    old = Scheduler("a", 1, None, clock)
    old.observe_status(status("b", True))
    old.fail("b", "heartbeat", 2.1)
    snap = decode(encode(old.snapshot()))
    new = Scheduler("c", 2, snap, clock)  # type: ignore[arg-type]
    assert new.nodes == old.nodes
    ev = new.record("scheduler-elected", node="c")
    assert ev.seq == old.events[-1].seq + 1 and ev.term == 2
    out = new.snapshot()
    assert out.term == 2 and out.leader == "c" and out.version > snap.version  # type: ignore[union-attr]


def test_prune_forgets_long_gone_nodes() -> None:
    clock = FakeClock()
    s = Scheduler("a", 1, None, clock)
    s.observe_status(status("b", True))
    s.observe_status(status("b", False, "left"))
    clock.advance(FORGET_AFTER_S + 1)
    s.prune()
    assert "b" not in s.nodes
