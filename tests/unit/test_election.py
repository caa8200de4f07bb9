"""Election rules with a fake clock: tie-breaks, stagger, fencing, stale and ghost claims."""

from __future__ import annotations

import pytest

from daemon.cluster.election import Action, Election, better
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import ElectionConfig

pytestmark = pytest.mark.timeout(30)
CFG = ElectionConfig(stagger_s=0.3, grace_s=1.5)


def make(me: str, clock: FakeClock) -> Election:
    el = Election(me, CFG, clock)
    el.connected()
    return el


def test_no_one_stands_during_grace() -> None:
    clock = FakeClock()
    el = make("a", clock)
    clock.advance(1.0)
    assert el.tick({"b"}).action is Action.NONE
    clock.advance(0.6)
    verdict = el.tick({"b"})
    assert verdict.action is Action.CLAIM and verdict.term == 1 and el.is_leader


def test_candidates_stand_in_id_order() -> None:
    clock = FakeClock()
    els = {n: make(n, clock) for n in ("a", "b", "c")}
    clock.advance(1.5)
    live = set(els)
    assert els["b"].tick(live - {"b"}).action is Action.NONE  # rank 1 waits a stagger
    assert els["a"].tick(live - {"a"}).action is Action.CLAIM
    for n in ("b", "c"):
        assert els[n].on_claim("a", 1).action is Action.FOLLOW
    clock.advance(5)
    for n in ("b", "c"):
        assert els[n].tick(live - {n}).action is Action.NONE  # leader alive: nobody stands


def test_tie_break_lower_id_wins_and_loser_steps_down() -> None:
    clock = FakeClock()
    a, b = make("a", clock), make("b", clock)
    clock.advance(10)
    assert a.tick(set()).action is Action.CLAIM  # each thinks it is alone
    assert b.tick(set()).action is Action.CLAIM
    assert b.on_claim("a", 1).action is Action.STEP_DOWN
    assert a.on_claim("b", 1).action is Action.CLAIM  # a re-asserts over the worse claim
    assert a.is_leader and b.leader == "a"
    assert better((1, "a"), (1, "b")) and better((2, "z"), (1, "a"))


def test_stale_leader_is_fenced_and_steps_down() -> None:
    clock = FakeClock()
    old, new, follower = make("a", clock), make("b", clock), make("c", clock)
    clock.advance(2)
    old.tick({"b", "c"})
    for el in (new, follower):
        el.on_claim("a", 1)
    # a is frozen; b and c lose it and elect b in term 2.
    for el in (new, follower):
        el.leader_lost()
    clock.advance(1)
    assert new.tick({"c"}).action is Action.CLAIM and new.term == 2
    follower.on_claim("b", 2)
    # a thaws still believing it leads term 1: its commands are fenced.
    assert old.is_leader and not follower.admits(1, "a")
    assert follower.admits(2, "b") and not follower.admits(2, "a")
    assert follower.admits(3, "b")  # a newer term than known may come before its claim
    # its stale claim is answered by a re-assertion; seeing term 2, it steps down.
    assert new.on_claim("a", 1).action is Action.CLAIM
    assert old.on_claim("b", 2).action is Action.STEP_DOWN
    assert not old.is_leader and old.term == 2


def test_ghost_claim_of_earlier_run_is_not_followed_by_its_namesake() -> None:
    clock = FakeClock()
    el = make("a", clock)
    assert el.on_claim("a", 7).action is Action.NONE  # retained by a previous process
    assert el.leader is None and el.term == 7
    clock.advance(2)
    verdict = el.tick({"b"})
    assert verdict.action is Action.CLAIM and verdict.term == 8


def test_disconnected_node_never_stands() -> None:
    clock = FakeClock()
    el = make("a", clock)
    el.disconnected()
    clock.advance(100)
    assert el.tick(set()).action is Action.NONE
