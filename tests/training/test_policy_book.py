"""Which policies still govern a round to come (the links a worker must keep), and when the
divergence guard compares (unit)."""

from __future__ import annotations

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
