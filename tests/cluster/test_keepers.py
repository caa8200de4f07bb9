"""Where the copies of the snapshots go (daemon.cluster.keepers), with a fake clock; and the
negotiator ordering them from what the heartbeats said."""

from __future__ import annotations

import pytest

from daemon.cluster.keepers import IDLE_S, RETRY_S, Box, Keepers
from daemon.cluster.primitives import HOLD_S, Negotiator
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.protocol import CopySnapshot

pytestmark = pytest.mark.timeout(10)


def box(disk: int, worker: bool = False, member: bool = False, shelf: str = "h:1") -> Box:
    return Box(disk=disk, worker=worker, member=member, shelf=shelf)


def settled(keepers: Keepers, clock: FakeClock, boxes: dict[str, Box]) -> None:
    keepers.observe(boxes)
    clock.advance(IDLE_S)
    keepers.observe(boxes)


def test_a_lone_member_has_its_newest_snapshot_copied_to_a_box_that_does_not_train() -> None:
    clock = FakeClock()
    k = Keepers(copies=1, every_steps=100, clock=clock)
    boxes = {"a": box(500, worker=True, member=True), "b": box(-1, shelf="10.0.0.2:7"),
             "c": box(-1)}
    settled(k, clock, boxes)
    assert k.copies_due(boxes) == [("a", CopySnapshot(step=500, to="b", addr="10.0.0.2:7"))]
    assert k.copies_due(boxes) == []  # ordered: not again while it is on its way
    clock.advance(RETRY_S)
    assert [c.to for _, c in k.copies_due(boxes)] == ["b"]  # never seen there: again
    boxes["b"] = box(500)
    clock.advance(RETRY_S)
    assert k.copies_due(boxes) == []  # held now, within the interval
    boxes["a"] = box(700, worker=True, member=True)
    assert [(c.step, c.to) for _, c in k.copies_due(boxes)] == [(700, "b")]  # out of date


def test_enough_members_hold_their_own_and_no_copy_goes_anywhere() -> None:
    clock = FakeClock()
    k = Keepers(copies=1, every_steps=100, clock=clock)
    boxes = {"a": box(500, worker=True, member=True), "b": box(420, worker=True, member=True),
             "c": box(-1)}
    settled(k, clock, boxes)
    assert k.copies_due(boxes) == []
    two = Keepers(copies=2, every_steps=100, clock=clock)
    settled(two, clock, boxes)
    assert [c.to for _, c in two.copies_due(boxes)] == ["c"]


def test_no_copy_goes_to_a_box_with_a_worker_a_box_just_idle_or_one_without_a_shelf() -> None:
    clock = FakeClock()
    k = Keepers(copies=2, every_steps=100, clock=clock)
    boxes = {"a": box(500, worker=True, member=True), "b": box(-1, worker=True),
             "c": box(-1, shelf=""), "d": box(-1)}
    k.observe(boxes)
    assert k.copies_due(boxes) == []  # d's worker may be restarting: not idle long enough
    clock.advance(IDLE_S)
    k.observe(boxes)
    assert [c.to for _, c in k.copies_due(boxes)] == ["d"]
    assert Keepers(copies=0, every_steps=100, clock=clock).copies_due(boxes) == []


def test_with_no_member_the_newest_copy_goes_to_the_held_joiner_with_the_most() -> None:
    clock = FakeClock()
    k = Keepers(copies=1, every_steps=100, clock=clock)
    boxes = {"a": box(-1, worker=True, shelf="10.0.0.1:7"), "b": box(40, worker=True),
             "k": box(900)}
    settled(k, clock, boxes)
    due = k.restore_due(boxes, held={"a": 0, "b": 40})
    assert due == [("k", CopySnapshot(step=900, to="b", addr="h:1", restore=True))]
    assert k.restore_due(boxes, held={"a": 0, "b": 40}) == []  # on its way
    boxes["b"] = box(900, worker=True)  # landed; the worker restarts and asks again
    clock.advance(RETRY_S)
    assert k.restore_due(boxes, held={"a": 0, "b": 40}) == []
    # A joiner that holds as new a state needs nothing.
    assert k.restore_due(boxes, held={"a": 900}) == []


def order_copies(neg: Negotiator, clock: FakeClock) -> list[CopySnapshot]:
    neg.tick()
    clock.advance(IDLE_S)
    neg.tick()
    return [body for _, body in neg.out if isinstance(body, CopySnapshot)]


def test_the_negotiator_orders_copies_from_the_heartbeats_and_presence() -> None:
    clock = FakeClock()
    sched = Scheduler("a", 1, None, clock)
    shelves = {"a": "127.0.0.1:11", "b": "127.0.0.1:12"}
    neg = Negotiator(sched, clock, lambda _n: 300, keepers=Keepers(1, 100, clock),
                     shelf_of=lambda n: shelves.get(n, ""))
    neg.join("a", "127.0.0.1:1", [], step=0)
    sched.set_node("b", state="standby")
    neg.observe_worker("a", "active", 300, attached=True, snapshot=300)
    neg.observe_worker("b", "standby", 0, attached=False, snapshot=-1)
    copies = order_copies(neg, clock)
    assert copies == [CopySnapshot(step=300, to="b", addr="127.0.0.1:12")]
    assert [n for n, body in neg.out if isinstance(body, CopySnapshot)] == ["a"]


def test_after_a_power_cut_a_copy_on_a_box_that_does_not_train_is_restored() -> None:
    """The lone member's disk was lost; the box that kept its copy came back and trains
    nothing. The joiner is held (a newer snapshot is up), and the copy is sent to it."""
    clock = FakeClock()
    t0 = clock.monotonic()
    sched = Scheduler("a", 1, None, clock)
    sched.step = 420  # the cluster had a state
    neg = Negotiator(sched, clock, lambda _n: 0, keepers=Keepers(1, 100, clock),
                     shelf_of=lambda n: f"127.0.0.1:{ord(n)}")
    sched.set_node("k", state="standby")
    neg.observe_worker("k", "standby", 0, attached=False, snapshot=400)
    neg.observe_worker("a", "joining", 0, attached=True, snapshot=-1)
    neg.join("a", "127.0.0.1:1", [], step=0)
    assert neg.held == {"a": 0}  # k's disk holds a newer state
    copies = order_copies(neg, clock)
    assert copies == [CopySnapshot(step=400, to="a", addr="127.0.0.1:97", restore=True)]
    assert [n for n, body in neg.out if isinstance(body, CopySnapshot)] == ["k"]
    # a's worker restarts with the copy and asks again holding it: the cluster goes on.
    neg.gone("a", "worker-exit")
    neg.observe_worker("a", "joining", 400, attached=True, snapshot=400)
    neg.join("a", "127.0.0.1:1", [], step=400)
    assert sched.nodes["a"].state == "active"
    [ev] = [e for e in sched.events if e.kind == "state-restored"]
    assert ev.detail["step"] == 400 and ev.detail["steps_lost"] == 20
    assert clock.monotonic() - t0 < HOLD_S  # well inside the hold: nothing started over
    assert not [e for e in sched.events if e.kind == "state-lost"]
