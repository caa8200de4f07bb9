"""The fetch's bookkeeping without sockets: a fake clock and simulated arrivals drive a
:class:`Ledger` through steals and source failures, and every byte still arrives exactly once
and every block is verified."""

from __future__ import annotations

import itertools
import random

import pytest

from chaos_edge.replication import Neighbor, PlanInput, make_plan
from chaos_edge.replication.manifest import RAW_DTYPE, Entry, Manifest
from chaos_edge.replication.transfer import FetchOptions
from chaos_edge.replication.transfer.ledger import Ledger, Task

pytestmark = pytest.mark.timeout(60)

BLOCK = 1 << 16
SIZE = 4 << 20 | 12345  # a short last block
MIN_PIECE = 16 << 10


class Clock:
    """Seconds that the test advances."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def manifest() -> Manifest:
    """A one-tensor state; the digests are never checked here (the test says which are good)."""
    nb = -(-SIZE // BLOCK)
    return Manifest(1, SIZE, BLOCK, ("0" * 32,) * nb, (Entry("t", RAW_DTYPE, (SIZE,), 0, SIZE),))


def ledger(rates: dict[str, float], clock: Clock, **opts: object) -> Ledger:
    """A ledger over a water-filling plan from ``rates`` (bytes/s)."""
    m = manifest()
    nbrs = [Neighbor(n, 0.0, 1.0 / r) for n, r in rates.items()]
    plan = make_plan("chaos", PlanInput.create(nbrs, m.segments(), align_bytes=BLOCK))
    options = FetchOptions(min_piece_bytes=MIN_PIECE, **opts)  # type: ignore[arg-type]
    return Ledger(plan, m, options, clock=clock)


def test_an_unmeasured_source_gets_only_a_few_small_requests() -> None:
    led = ledger({"a": 100e6, "b": 100e6}, Clock())
    # The plan's rate would keep 0.2 s (20 MB) requested ahead; unmeasured, it gets two pieces.
    first = led.next_tasks("a", 0)
    assert len(first) == 2 and sum(t.length for t in first) <= 2 * MIN_PIECE
    assert led.next_tasks("a", 2) == []
    # Once it has delivered them, it may have as much in flight as it delivered.
    for t in first:
        led.arrived("a", t, t.offset, t.length)
    more = led.next_tasks("a", 0)
    assert 0 < sum(t.length for t in more) <= sum(t.length for t in first)


@pytest.mark.parametrize("seed", range(6))
def test_steals_and_failures_deliver_every_byte_once(seed: int) -> None:
    """Sources far slower or faster than planned, one or two failing mid-transfer: the bytes
    delivered (repairs aside) cover the state exactly once, and the fetch completes."""
    rng = random.Random(seed)
    clock = Clock()
    planned = {"a": 1e6, "b": 2e6, "c": 4e6}
    actual = {s: r * rng.choice([0.05, 0.5, 1.0, 3.0]) for s, r in planned.items()}
    led = ledger(planned, clock)
    doomed = rng.sample(sorted(planned), rng.choice([1, 2]))
    fail_at = {s: rng.uniform(0.01, 0.3) for s in doomed}
    covered: list[tuple[int, int]] = []  # every byte range that arrived (repairs aside)
    inflight: dict[str, list[Task]] = {s: [] for s in planned}
    partial: dict[str, int] = dict.fromkeys(planned, 0)  # bytes of the head task in
    dt = 0.001
    for _ in range(200_000):
        if led.complete or led.fatal is not None:
            break
        clock.now += dt
        for s in sorted(led.alive):
            if s in fail_at and clock.now >= fail_at[s]:
                led.fail(s, ConnectionResetError("killed"), inflight[s])
                inflight[s] = []
                continue
            inflight[s] += led.next_tasks(s, len(inflight[s]))
            budget = int(actual[s] * dt)
            while budget and inflight[s]:  # the head request's bytes arrive in order
                t = inflight[s][0]
                n = min(budget, t.length - partial[s])
                off = t.offset + partial[s]
                for b in led.arrived(s, t, off, n):
                    led.checked(s, b, True)
                if t.block is None:
                    covered.append((off, n))
                partial[s] += n
                budget -= n
                if partial[s] == t.length:
                    inflight[s].pop(0)
                    partial[s] = 0
    assert led.fatal is None and led.complete
    covered.sort()
    assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(covered))  # no gap, no overlap
    assert covered[0][0] == 0 and sum(n for _, n in covered) == SIZE
    gone = {s for s in doomed if fail_at[s] <= clock.now}
    assert set(led.failed) == gone and len(led.replans) == len(gone)
    timings = led.timings()
    assert sum(t.bytes for t in timings.values()) == SIZE
    assert sum(t.taken_bytes for t in timings.values()) == sum(
        t.given_bytes for t in timings.values()
    )


def test_a_bad_block_goes_back_to_its_sender_then_to_another() -> None:
    led = ledger({"a": 10e6, "b": 10e6}, Clock(), same_source_tries=1, max_block_tries=3)
    start, size = led.manifest.block_range(0)
    led.checked("a", 0, False)
    assert list(led.repairs["a"]) == [Task(start, size, 0)]
    led.repairs["a"].clear()
    led.owner[0] = "a"
    led.checked("a", 0, False)
    assert list(led.repairs["b"]) == [Task(start, size, 0)]
    led.checked("b", 0, False)
    led.checked("b", 0, False)
    assert led.fatal is not None and "block 0" in str(led.fatal)
