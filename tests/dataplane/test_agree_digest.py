"""The divergence guard's digests in the agreement: wire forms, tally, majority, real links."""

from __future__ import annotations

import hashlib
import struct
import threading
import time
from collections.abc import Iterator

import pytest

from chaos_edge.dataplane import (
    AllReducer,
    DataPlaneError,
    LinkConfig,
    PeerLinks,
    RoundAborted,
    SyncPolicy,
)
from chaos_edge.dataplane.agree import (
    MAX_SUMMARY_BYTES,
    MAX_TALLY,
    Decision,
    Summary,
    decide,
)
from chaos_edge.dataplane.frames import FrameHeader, Kind, phase_flags
from chaos_edge.dataplane.rounds import MAX_REASON
from tests.dataplane.conftest import SECRET

pytestmark = pytest.mark.timeout(60)
X, Y, Z = (hashlib.sha256(s).digest() for s in (b"x", b"y", b"z"))


def _d(i: int) -> bytes:
    return hashlib.sha256(str(i).encode()).digest()


# --- wire forms ---------------------------------------------------------------------------
def test_summary_and_decision_round_trip() -> None:
    s = Summary.of(7, True, X).merge(Summary.of(7, False, Y)).merge(Summary.of(7, False, X))
    assert s.tally == ((X, 2), (Y, 1))
    assert Summary.unpack(s.pack()) == s
    assert Summary.unpack(Summary.of(3, False).pack()) == Summary(3, 3, False, ())
    for dec in (Decision(9, True, X, 2), Decision(9, False), Decision(0, True, Y, 1)):
        assert Decision.unpack(dec.pack()) == dec
    assert len(Summary.of(1, False).pack()) == 18 and len(Decision(1, True).pack()) == 46


def test_the_largest_summary_fits_an_early_control_frame() -> None:
    """An AGREE_UP of a phase not opened yet is held off the reader thread only up to
    MAX_REASON bytes (early.py)."""
    s = Summary(1, 1, False)
    for i in range(3 * MAX_TALLY):
        s = s.merge(Summary.of(1, False, _d(i)))
    assert len(s.tally) == MAX_TALLY and len(s.pack()) == MAX_SUMMARY_BYTES <= MAX_REASON


@pytest.mark.parametrize(
    "raw",
    [
        b"",
        b"\0" * 17,
        Summary.of(1, False, X).pack()[:-1],  # one byte short of its entry
        Summary.of(1, False, X).pack() + b"\0",
        Summary.of(1, False).pack()[:-1] + b"\1",  # claims one entry, carries none
        Summary.of(1, False, X).pack()[:-1] + b"\0",  # an entry with no votes
        struct.pack("!qqBB", 1, 1, 0, 2) + struct.pack("!32sI", X, 1) * 2,  # a repeated digest
        struct.pack("!qqBB", 1, 1, 0, 9) + struct.pack("!32sI", X, 1) * 9,  # over MAX_TALLY
    ],
)
def test_malformed_summaries_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        Summary.unpack(raw)


@pytest.mark.parametrize(
    "raw",
    [
        Decision(1, True, X, 1).pack()[:-1],
        Decision(1, True, X, 1).pack() + b"\0",
        struct.pack("!qBIB32s", 1, 1, 1, 5, X),  # a digest length that is no SHA-256
        struct.pack("!qBIB32s", 1, 1, 0, 32, X),  # a digest among no digests
        struct.pack("!qBIB32s", 1, 1, 2, 0, b""),  # digests without the majority's
        struct.pack("!qBIB32s", 1, 1, 0, 0, b"\1"),  # padding that is not zero
    ],
)
def test_malformed_decisions_are_refused(raw: bytes) -> None:
    with pytest.raises(ValueError):
        Decision.unpack(raw)


def test_a_digest_must_be_32_bytes_or_none() -> None:
    with pytest.raises(ValueError):
        Summary.of(1, False, b"short")
    with pytest.raises(ValueError):
        Decision(1, True, b"short", 1).pack()


# --- tally and majority -------------------------------------------------------------------
def test_merge_keeps_the_newest_steps_tally_and_adds_equal_ones() -> None:
    ahead, behind = Summary.of(5, False, X), Summary.of(4, True, Y)
    assert ahead.merge(behind) == Summary(4, 5, True, ((X, 1),))
    assert behind.merge(ahead) == ahead.merge(behind)  # the order of children is irrelevant
    assert Summary.of(4, True).merge(ahead).tally == ((X, 1),)
    # A node with no digest neither counts nor clears the others'.
    assert Summary.of(5, False).merge(ahead).merge(Summary.of(5, False, X)).tally == ((X, 2),)


def test_the_tally_keeps_the_largest_counts() -> None:
    s = Summary.of(1, False, X).merge(Summary.of(1, False, X))
    for i in range(MAX_TALLY + 3):
        s = s.merge(Summary.of(1, False, _d(i)))
    assert len(s.tally) == MAX_TALLY and s.tally[0] == (X, 2)
    assert decide(s) == Decision(1, True, X, MAX_TALLY)


def test_the_majority_wins_and_a_tie_goes_to_the_root_else_the_smallest() -> None:
    three = Summary.of(2, False, Y).merge(Summary.of(2, False, X)).merge(Summary.of(2, False, Y))
    assert decide(three, X) == Decision(2, True, Y, 2)  # the root is outvoted
    tie = Summary.of(2, False, Y).merge(Summary.of(2, False, X))
    assert decide(tie, Y) == Decision(2, True, Y, 2)  # the root's side
    assert decide(tie, Z) == decide(tie) == Decision(2, True, min(X, Y), 2)
    assert decide(Summary.of(2, False)) == Decision(2, True, b"", 0)
    assert decide(Summary.of(2, False, X)) == Decision(2, True, X, 1)


def test_every_member_behind_and_holding_applies_the_round() -> None:
    # A root outside the epoch may have committed it (soak fault 19): no rerun contradicts it.
    every = Summary.of(4, True, X).merge(Summary.of(4, True, X)).merge(Summary.of(4, True, Y))
    assert decide(every, X) == Decision(5, True)  # the digests are of step 4: none compared
    lacking = Summary.of(4, True, X).merge(Summary.of(4, False, X))
    assert decide(lacking) == Decision(4, True, X, 1)  # one never acked: nobody committed


def test_digests_do_not_change_the_agreed_step() -> None:
    for low, high, hold in [(3, 3, False), (3, 3, True), (3, 4, True), (3, 4, False), (2, 4, True)]:
        plain = decide(Summary(low, low, hold).merge(Summary(high, high, False)))
        dec = decide(Summary.of(low, hold, Y).merge(Summary.of(high, False, X)))
        assert (dec.step, dec.consistent) == (plain.step, plain.consistent)
        # Only the newest step's digests count: a node behind has an older state.
        assert dec.digests == (2 if low == high else 1)


# --- over real links ----------------------------------------------------------------------
@pytest.fixture
def four() -> Iterator[dict[str, AllReducer]]:
    """Four nodes on loopback: the chain a - b - c - d."""
    ids = ["a", "b", "c", "d"]
    links = {n: PeerLinks(n, "t", SECRET, is_member=lambda p: True,
                          config=LinkConfig(io_poll=0.2)) for n in ids}  # fmt: skip
    for lk in links.values():
        lk.start()
    for a, b in [("a", "b"), ("b", "c"), ("c", "d")]:
        links[b].allow(a)
        links[a].connect_to(b, *links[b].address)
    yield {n: AllReducer(lk, chunk_bytes=1024, timeout=10.0) for n, lk in links.items()}
    for lk in links.values():
        lk.close()


def _agree_all(
    nodes: dict[str, AllReducer], policy: SyncPolicy, given: dict[str, tuple[int, bool, bytes]]
) -> dict[str, Decision]:
    """Run one agreement on every node of ``given`` (node -> committed, holds, digest)."""
    got: dict[str, Decision | BaseException] = {}

    def run(node: str) -> None:
        committed, holds, digest = given[node]
        try:
            got[node] = nodes[node].agree(
                policy=policy, committed=committed, holds=holds, digest=digest, timeout=20.0
            )
        except BaseException as exc:  # reported by the assert below
            got[node] = exc

    threads = [threading.Thread(target=run, args=(n,)) for n in given]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert all(isinstance(d, Decision) for d in got.values()) and len(got) == len(given), got
    return {n: d for n, d in got.items() if isinstance(d, Decision)}


@pytest.mark.parametrize("odd", ["a", "b", "d"])  # a leaf, the root, a leaf under an inner node
def test_four_nodes_agree_on_the_majority_digest(four: dict[str, AllReducer], odd: str) -> None:
    policy = SyncPolicy.build(1, list(four), [("a", "b"), ("b", "c"), ("c", "d")], "b")
    given = {n: (6, False, Y if n == odd else X) for n in four}
    decisions = _agree_all(four, policy, given)
    assert set(decisions.values()) == {Decision(6, True, X, 2)}


def test_a_tie_keeps_the_roots_side_and_a_node_behind_is_not_compared(
    trio: dict[str, AllReducer],
) -> None:
    """a and b differ, c gives none: no majority, so the root b's digest is kept. Then c is
    a step behind and holds the result: its (older) digest is left out of the comparison."""
    policy = SyncPolicy.build(1, ["a", "b", "c"], [("a", "b"), ("b", "c")], "b")
    given = {"a": (3, False, X), "b": (3, False, Y), "c": (3, False, b"")}
    assert set(_agree_all(trio, policy, given).values()) == {Decision(3, True, Y, 2)}
    policy = SyncPolicy.build(2, ["a", "b", "c"], [("a", "b"), ("b", "c")], "b")
    given = {"a": (4, False, X), "b": (4, False, X), "c": (3, True, Z)}
    assert set(_agree_all(trio, policy, given).values()) == {Decision(4, True, X, 1)}


def test_a_bad_digest_argument_is_refused_before_the_agreement(trio: dict[str, AllReducer]) -> None:
    solo = trio["solo"]
    with pytest.raises(DataPlaneError, match="32 bytes"):
        solo.agree(
            policy=SyncPolicy.build(1, ["solo"], [], "solo"),
            committed=0,
            holds=False,
            digest=b"\0" * 31,
        )
    dec = solo.agree(
        policy=SyncPolicy.build(1, ["solo"], [], "solo"), committed=0, holds=False, digest=X
    )
    assert dec == Decision(0, True, X, 1)  # the rejected call did not use up the tag


def _send_agreement_frame(
    sender: AllReducer, to: str, kind: Kind, payload: bytes, version: int
) -> None:
    header = FrameHeader(kind, 0, version, 0, 0, len(payload), phase_flags(0, agreement=True))
    sender.links.send(to, header, payload, time.monotonic() + 5.0)


@pytest.mark.parametrize(
    "payload",
    [
        Summary.of(1, False, X).pack() + b"\0\0",  # a length no summary has
        Summary.of(1, False).pack()[:-1] + b"\3",  # a count its length does not carry
    ],
)
def test_a_malformed_summary_on_the_wire_is_a_protocol_violation(
    trio: dict[str, AllReducer], payload: bytes
) -> None:
    policy = SyncPolicy.build(4, ["a", "b"], [("a", "b")], "b")
    _send_agreement_frame(trio["a"], "b", Kind.AGREE_UP, payload, 4)
    with pytest.raises(RoundAborted, match="protocol violation by a"):
        trio["b"].agree(policy=policy, committed=1, holds=False, digest=X, timeout=10.0)


def test_a_malformed_decision_on_the_wire_is_a_protocol_violation(
    trio: dict[str, AllReducer],
) -> None:
    policy = SyncPolicy.build(4, ["a", "b"], [("a", "b")], "b")
    _send_agreement_frame(
        trio["b"], "a", Kind.AGREE_DOWN, struct.pack("!qBIB32s", 1, 1, 1, 7, X), 4
    )
    with pytest.raises(RoundAborted, match="protocol violation by b"):
        trio["a"].agree(policy=policy, committed=1, holds=False, digest=X, timeout=10.0)
