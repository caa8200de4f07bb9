"""Run-time rebalancing of the fetch: sources that are slower than planned hand their tail to
the others, every byte still comes exactly once and verified (real servers on loopback)."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator

import numpy as np
import pytest

from chaos_edge.dataplane import auth
from chaos_edge.replication import Neighbor, PlanInput, make_plan
from chaos_edge.replication.manifest import RAW_DTYPE, Entry, Manifest, block_digests
from chaos_edge.replication.planning.model import ReplicationPlan, merge_ranges
from chaos_edge.replication.transfer import FetchOptions, Snapshot, StateServer, fetch, serve
from chaos_edge.replication.transfer.balance import (
    RateMeter,
    cut_head,
    piece_bytes,
    steal_size,
    take_tail,
)

pytestmark = pytest.mark.timeout(120)

SECRET = b"rebalance-test-secret"
BLOCK = 1 << 16
SIZE = 8 << 20
FAST, SLOW = 16e6, 1e6  # bytes/s
NODES = ("n0", "n1", "n2")


def ident(node: str) -> auth.Identity:
    """Credentials of ``node`` in the test cluster."""
    return auth.Identity(node, "test", SECRET, auth.new_incarnation())


@pytest.fixture(scope="module")
def snap() -> Snapshot:
    """8 MiB of random bytes as one tensor (the shape a static split handles worst)."""
    data = np.random.default_rng(3).integers(0, 256, SIZE, dtype=np.uint8).tobytes()
    entry = Entry("t0", RAW_DTYPE, (SIZE,), 0, SIZE)
    manifest = Manifest(1, SIZE, BLOCK, block_digests(data, BLOCK), (entry,))
    manifest.validate()
    return Snapshot.create(manifest, data)


@pytest.fixture
def servers(snap: Snapshot) -> Iterator[dict[str, StateServer]]:
    """n0 sends at a sixteenth of the others' rate (its link is slow); all closed at the end."""
    made: dict[str, StateServer] = {}
    try:
        for n in NODES:
            rate = SLOW if n == "n0" else FAST
            made[n] = serve(snap, ident(n), rate=lambda _p, r=rate: r)
        yield made
    finally:
        for s in made.values():
            s.close()


def equal_plan(snap: Snapshot, planner: str = "chaos") -> ReplicationPlan:
    """A plan that believes every source is as fast as the fast ones."""
    nbrs = [Neighbor(n, 0.0, 1 / FAST) for n in NODES]
    inputs = PlanInput.create(nbrs, snap.manifest.segments(), align_bytes=BLOCK)
    return make_plan(planner, inputs)


def sent(servers: dict[str, StateServer], total: int = 0) -> dict[str, int]:
    """Bytes each server sent. With ``total``: once they add up to it, or after 5 s (a server
    counts a block after its send returns, which can be after the new node has the bytes)."""
    deadline = time.monotonic() + 5.0
    while True:
        out = {n: s.stats().bytes_sent for n, s in servers.items()}
        if sum(out.values()) >= total or time.monotonic() > deadline:
            return out
        time.sleep(0.01)


def test_a_slow_source_hands_its_tail_to_the_others(snap, servers) -> None:
    plan = equal_plan(snap)
    planned = {n: plan.bytes_of(n) for n in NODES}
    addrs = {n: s.address for n, s in servers.items()}
    seen: dict[str, int] = {}
    res = fetch(plan, snap.manifest, addrs, ident("new"),
                progress=lambda n, done, _total: seen.__setitem__(n, done))  # fmt: skip
    assert res.buffer == snap.data and res.refetched_blocks == [] and res.replans == []
    src = res.sources
    # Every byte exactly once: what the servers sent is what arrived, and that is the state.
    assert sum(sent(servers, SIZE).values()) == SIZE
    assert {n: t.bytes for n, t in src.items()} == sent(servers)
    assert seen == {n: t.assigned_bytes for n, t in src.items()}
    # The slow source's tail went to the fast ones, and nothing moved the other way.
    assert src["n0"].given_bytes > 0 and src["n0"].taken_bytes == 0
    assert src["n0"].bytes == planned["n0"] - src["n0"].given_bytes
    assert src["n0"].bytes < planned["n0"] // 2
    assert sum(t.taken_bytes for t in src.values()) == sum(t.given_bytes for t in src.values())
    assert sum(s.nbytes for s in res.steals) == sum(t.taken_bytes for t in src.values())
    assert {s.thief for s in res.steals if s.victim == "n0"} <= {"n1", "n2"}
    # At a sixteenth of their rate it ends with about a sixteenth of their bytes (a loose
    # factor for scheduling noise; unbalanced, it would have sent a third of the state).
    fair = SIZE * SLOW / (SLOW + 2 * FAST)
    assert src["n0"].bytes < 4 * fair
    # Stolen ranges are whole blocks past the victim's last requested byte.
    moved = merge_ranges(r for s in res.steals for r in s.ranges)
    assert all(off % BLOCK == 0 for off, _ in moved)


def test_without_rebalancing_each_source_sends_its_plan(snap, servers) -> None:
    plan = equal_plan(snap)
    addrs = {n: s.address for n, s in servers.items()}
    res = fetch(plan, snap.manifest, addrs, ident("new"), options=FetchOptions(rebalance=False))
    assert res.buffer == snap.data and res.steals == []
    assert {n: t.bytes for n, t in res.sources.items()} == {n: plan.bytes_of(n) for n in NODES}
    # The slow source, with a third of the state, is the last to finish.
    ends = {n: t.end_s for n, t in res.sources.items()}
    assert max(ends, key=lambda n: ends[n] or 0.0) == "n0"


def test_a_source_planned_nothing_takes_work(snap, servers) -> None:
    # ``single`` plans everything on one source (n0 here: all believed equal). Rebalancing
    # lets the other two take most of it.
    plan = equal_plan(snap, "single")
    assert [n for n in NODES if plan.bytes_of(n)] == ["n0"]
    addrs = {n: s.address for n, s in servers.items()}
    res = fetch(plan, snap.manifest, addrs, ident("new"))
    assert res.buffer == snap.data
    assert all(t.bytes > 0 for t in res.sources.values())
    assert res.sources["n0"].bytes < SIZE // 2
    assert sum(sent(servers, SIZE).values()) == SIZE


def test_steal_size_equalises_predicted_finish() -> None:
    x = steal_size(victim_left=1000, victim_rate=1.0, thief_left=100, thief_rate=3.0)
    assert (1000 - x) / 1.0 == pytest.approx((100 + x) / 3.0, abs=1.0)
    assert steal_size(100, 1.0, 1000, 1.0) == 0  # the thief would finish later anyway
    assert steal_size(100, 0.0, 0, 1.0) == 0


def test_take_tail_cuts_on_block_boundaries() -> None:
    queue: deque[tuple[int, int]] = deque([(0, 10 * BLOCK), (20 * BLOCK, 5)])
    taken = take_tail(queue, 3 * BLOCK + 100, BLOCK)
    # All of the short last range, then up to the next block boundary of the one before.
    assert taken == [(7 * BLOCK, 3 * BLOCK), (20 * BLOCK, 5)]
    assert list(queue) == [(0, 7 * BLOCK)]
    assert merge_ranges([*queue, *taken]) == ((0, 10 * BLOCK), (20 * BLOCK, 5))
    assert take_tail(deque([(0, 100)]), 30, BLOCK) == [(70, 30)]  # under a block: exact


def test_requests_are_cut_to_the_rate_and_on_blocks() -> None:
    assert piece_bytes(1e6, 0.025, 128 << 10, 8 << 20) == 128 << 10
    assert piece_bytes(100e6, 0.025, 128 << 10, 8 << 20) == 2_500_000
    assert piece_bytes(1e12, 0.025, 128 << 10, 8 << 20) == 8 << 20
    piece, rest = cut_head((100, 10 * BLOCK), 3 * BLOCK, BLOCK)
    assert piece == (100, 3 * BLOCK - 100) and rest == (3 * BLOCK, 7 * BLOCK + 100)
    assert cut_head((0, 50), 3 * BLOCK, BLOCK) == ((0, 50), (50, 0))


def test_rate_meter_follows_a_changing_rate() -> None:
    meter = RateMeter(10e6)
    assert meter.rate == pytest.approx(10e6)
    for _ in range(100):
        meter.add(10_000, 0.01)  # 1 MB/s for a second
    assert meter.rate == pytest.approx(1e6, rel=0.05)
