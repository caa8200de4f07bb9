"""``trainer.stalls``: the last 10,000 step timings, oldest first, in memory allocated once."""

from __future__ import annotations

import tracemalloc
from types import SimpleNamespace
from typing import Any, cast

import pytest

from chaos_edge.trainer.timing import StallMeter, StepLog, StepTiming
from daemon.contracts.clock import FakeClock

pytestmark = pytest.mark.timeout(30)


def _t(i: int) -> StepTiming:
    return StepTiming(i, i + 0.25, i % 3, i + 1.5, i + 0.75, i + 0.125)


def test_it_reads_like_the_list_it_replaced() -> None:
    log = StepLog(keep=4)
    assert len(log) == 0 and list(log) == [] and log[-3:] == []
    with pytest.raises(IndexError):
        log[-1]
    for i in range(3):
        log.append(_t(i))
    assert list(log) == [_t(0), _t(1), _t(2)] and log[-1] == _t(2) and log[0] == _t(0)
    for i in range(3, 10):
        log.append(_t(i))
    assert list(log) == [_t(i) for i in range(6, 10)]  # the last ``keep``, oldest first
    assert log[-1] == _t(9) and log[-4] == _t(6) and log[1:3] == [_t(7), _t(8)]
    with pytest.raises(IndexError):
        log[4]
    with pytest.raises(IndexError):
        log[-5]


def test_appending_allocates_nothing() -> None:
    log = StepLog()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for i in range(25_000):  # past the ring's size
            log.append(_t(100_000 + i))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 64 << 10, grown  # a list of tuples kept about 2 MiB
    assert log[-1].step == 124_999 and len(log) == 10_000


def test_a_steps_compute_is_its_whole_cycle_but_the_collectives() -> None:
    """The policy controller's compute (issue 24): from one update()'s return to the next
    one's, less the time in the collectives (waits for peers are theirs, not ours)."""
    computed: list[float] = []
    poller = SimpleNamespace(record_sync=lambda _ms: None, record_compute=computed.append)
    session = SimpleNamespace(poller=poller, report=lambda _r: None)
    clock = FakeClock()
    meter = StallMeter(cast(Any, session), clock)
    clock.advance(0.5)  # before the first update(): nothing to measure against yet
    t0 = clock.monotonic()
    clock.advance(0.2)
    meter.account(t0, 0.15, 0, "", step=1, version=1)
    assert computed == []
    clock.advance(0.03)  # the script's forward and backward
    t0 = clock.monotonic()
    clock.advance(0.1)  # 0.08 s in the collectives, 0.02 s the optimizer and the framework
    meter.account(t0, 0.08, 0, "", step=2, version=1)
    assert computed == [pytest.approx(50.0)]
    # A step that rejoined (dropped, or set aside as a straggler, and back) waited outside
    # the cluster for as long as that took: no measure of compute. The next one is again.
    clock.advance(0.03)
    t0 = clock.monotonic()
    clock.advance(20.0)
    meter.account(t0, 0.08, 0, "", step=3, version=2, rejoined=True)
    clock.advance(0.03)
    t0 = clock.monotonic()
    clock.advance(0.1)
    meter.account(t0, 0.08, 0, "", step=4, version=2)
    assert computed == [pytest.approx(50.0), pytest.approx(50.0)]
