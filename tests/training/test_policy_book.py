"""Which policies still govern a round to come (the links a worker must keep), and when the
divergence guard compares (unit)."""

from __future__ import annotations

from typing import Any

from chaos_edge.trainer.policy import PolicyBook
from daemon.contracts.policy import SyncPolicy

ABC = ("a", "b", "c")


def _pol(version: int, effective: int, edges: list[tuple[str, str]]) -> SyncPolicy:
    return SyncPolicy.build(version, ABC, edges, root="a", effective_step=effective)


def _book(*pols: SyncPolicy) -> PolicyBook:
    book = PolicyBook()
    for p in pols:
        book.put(p)
    return book


def test_a_policy_waiting_to_take_effect_still_governs() -> None:
    # v2 adds the link a-c at step 20; v3 removes it again at step 25, published before 20.
    v1 = _pol(1, 0, [("a", "b"), ("b", "c")])
    v2 = _pol(2, 20, [("a", "b"), ("a", "c")])
    v3 = _pol(3, 25, [("a", "b"), ("b", "c")])
    book = _book(v1, v2, v3)
    assert [p.version for p in book.governing_from(10)] == [3, 2, 1]
    assert [p.version for p in book.governing_from(22)] == [3, 2]
    assert [p.version for p in book.governing_from(25)] == [3]
    assert book.for_round(10) is v1  # what used to be the only policy consulted


def test_a_policy_overtaken_before_it_takes_effect_governs_nothing() -> None:
    v1 = _pol(1, 0, [("a", "b"), ("b", "c")])
    v2 = _pol(2, 30, [("a", "b"), ("a", "c")])
    v3 = _pol(3, 12, [("a", "c"), ("b", "c")])  # a failure: at once, before v2's step
    assert [p.version for p in _book(v1, v2, v3).governing_from(10)] == [3, 1]
    assert [p.version for p in _book(v1, v2, v3).governing_from(12)] == [3]
    assert _book().governing_from(0) == []


def test_the_guard_compares_when_a_member_joins_not_when_one_leaves() -> None:
    from chaos_edge.trainer.epochs import admits_newcomer

    v = _pol(1, 0, [("a", "b"), ("b", "c")])
    assert admits_newcomer(v, None)  # just joined: ours is the new state
    assert admits_newcomer(v, ("a", "b"))  # c joins
    assert not admits_newcomer(v, ("a", "b", "c"))  # a link change
    assert not admits_newcomer(v, ("a", "b", "c", "d"))  # d left
    assert admits_newcomer(v, ("a", "b", "d"))  # d left and c joined at once


def test_a_disconnect_that_overtook_its_policies_closes_nothing_until_they_come(
        tmp_path: Any, monkeypatch: Any) -> None:
    """The scheduler sends the drop's ``disconnect`` before the snapshot that carries the
    policies published with it and just before it. A worker that closed at once, from the
    policies it held, could not know that one of those (a wider tree over the very link)
    would govern its next round: every attempt of that round then failed on the closed link,
    and the policy without it never took effect (a demo run, stop 50)."""
    from chaos_edge.trainer.session import Session
    from daemon.contracts.protocol import Disconnect

    monkeypatch.setenv("CHAOS_DATA_BIND", "127.0.0.1")
    s = Session(tmp_path / "no-daemon.sock", 1.0)  # the control socket is never called here
    try:
        s.node_id = "a"
        closed: list[str] = []
        monkeypatch.setattr(s.links, "disconnect", lambda peer, reason="": closed.append(peer))
        v1 = _pol(1, 0, [("a", "b"), ("b", "c")])  # a's only tree edge: a-b
        s.book.put(v1)
        s._command(Disconnect(peer="c", policy_version=3))  # a-c dropped with v3
        s.settle(11)  # v1 alone does not need a-c, but v3 (and what came before it) is missing
        assert closed == []
        s.book.put(_pol(2, 12, [("a", "c"), ("b", "c")]))  # the wider tree, over a-c
        s.book.put(_pol(3, 15, [("a", "b"), ("b", "c")]))  # the drop
        s.settle(11)
        assert closed == []  # v2 governs rounds 12-14 over a-c
        s.settle(15)
        assert closed == ["c"]  # v3 governs: nothing needs it any more
        s._command(Disconnect(peer="b"))  # no policy named (0): judged on what we hold
        s.settle(15)
        assert closed == ["c"]  # v3 still routes a-b
    finally:
        s.close()
