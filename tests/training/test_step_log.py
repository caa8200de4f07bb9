"""``trainer.stalls``: the last 10,000 step timings, oldest first, in memory allocated once."""

from __future__ import annotations

import tracemalloc

import pytest

from chaos_edge.trainer.timing import StepLog, StepTiming

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
