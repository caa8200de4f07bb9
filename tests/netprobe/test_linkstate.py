"""Fail/recover logic of the RTT prober, driven by a manual clock: no sockets, no sleeping."""

from __future__ import annotations

import pytest

from netprobe.clock import FakeClock
from netprobe.linkstate import LinkTracker

pytestmark = pytest.mark.timeout(30)

ADDR = ("10.0.0.2", 7000)


def make(clock: FakeClock, **kw: float) -> LinkTracker:
    tracker = LinkTracker(clock=clock, **kw)  # type: ignore[arg-type]
    tracker.add_peer("b", ADDR)
    return tracker


def test_first_probe_is_due_immediately_then_every_interval() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, interval_s=1.0)
    probes, _ = tracker.poll()
    assert [p.peer for p in probes] == ["b"]
    assert tracker.poll()[0] == []  # nothing more until the interval passes
    clock.advance(0.999)
    assert tracker.poll()[0] == []
    clock.advance(0.001)
    assert len(tracker.poll()[0]) == 1


def test_reply_records_rtt_and_ewma() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, ewma_alpha=0.5)
    (probe,), _ = tracker.poll()
    clock.advance(0.010)
    assert tracker.on_reply(probe.seq) is None  # unknown -> up is not a recovery
    stats = tracker.stats("b")
    assert stats.state == "up"
    assert stats.rtt_last_s == pytest.approx(0.010)
    assert stats.rtt_ewma_s == pytest.approx(0.010)
    clock.advance(1.0 - 0.010)
    (probe,), _ = tracker.poll()
    clock.advance(0.030)
    tracker.on_reply(probe.seq)
    assert tracker.stats("b").rtt_ewma_s == pytest.approx(0.020)  # 0.01 + 0.5 * (0.03 - 0.01)


def test_the_minimum_rtt_is_the_smallest_of_the_window() -> None:
    """Queueing behind a bandwidth test inflates samples for a while; the minimum keeps the
    path's delay, and forgets a sample once it is older than the window."""
    clock = FakeClock(0.0)
    tracker = make(clock, min_window_s=3.0)
    for rtt in (0.001, 0.020, 0.025, 0.018, 0.030):
        (probe,), _ = tracker.poll()
        clock.advance(rtt)
        tracker.on_reply(probe.seq)
        clock.advance(1.0 - rtt)
    stats = tracker.stats("b")
    # Sent at 0, 1, 2, 3 and 4 s: the 1 ms one (at 0 s) is out of the window by now.
    assert stats.rtt_min_s == pytest.approx(0.018)
    assert stats.rtt_last_s == pytest.approx(0.030)


def test_fails_after_consecutive_misses_within_the_bound() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, interval_s=1.0, timeout_s=0.5, fail_after=3)
    (probe,), _ = tracker.poll()
    tracker.on_reply(probe.seq)
    died_at = clock.monotonic()
    failed_at = None
    while failed_at is None and clock.monotonic() < 100:
        # Wake exactly when there is work, as RttProber's loop does.
        deadline = tracker.next_deadline()
        assert deadline is not None
        clock.advance(max(0.0, deadline - clock.monotonic()))
        _, events = tracker.poll()
        if events:
            assert [e.kind for e in events] == ["failed"]
            failed_at = clock.monotonic()
    assert failed_at is not None
    assert failed_at - died_at <= tracker.detection_bound_s + 1e-9
    stats = tracker.stats("b")
    assert stats.state == "down"
    assert stats.consecutive_misses == 3 and stats.lost == 3
    # Further misses do not report the failure again.
    for _ in range(5):
        clock.advance(1.0)
        assert tracker.poll()[1] == []


def test_one_reply_recovers_and_resets_misses() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, interval_s=1.0, timeout_s=1.0, fail_after=2)
    events = []
    for _ in range(4):
        events += tracker.poll()[1]
        clock.advance(1.0)
    assert [e.kind for e in events] == ["failed"]
    (probe,), _ = tracker.poll()
    clock.advance(0.002)
    event = tracker.on_reply(probe.seq)
    assert event is not None and event.kind == "recovered"
    assert event.stats.state == "up" and event.stats.consecutive_misses == 0


def test_intermittent_loss_below_threshold_never_fails() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, interval_s=1.0, timeout_s=0.5, fail_after=3)
    for i in range(30):
        probes, events = tracker.poll()
        assert events == []
        if probes and i % 3 == 0:  # two of three probes are lost
            tracker.on_reply(probes[0].seq)
        clock.advance(0.5)
    assert tracker.stats("b").state == "up"
    assert tracker.stats("b").loss_ratio > 0.5


def test_late_reply_is_counted_not_used() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, interval_s=1.0, timeout_s=0.5)
    (probe,), _ = tracker.poll()
    clock.advance(0.6)
    tracker.poll()  # expires the probe
    assert tracker.on_reply(probe.seq) is None
    stats = tracker.stats("b")
    assert stats.late == 1 and stats.received == 0 and stats.rtt_ewma_s is None


def test_unknown_sequence_numbers_are_ignored() -> None:
    tracker = make(FakeClock(0.0))
    assert tracker.on_reply(123456) is None
    assert tracker.stats("b").received == 0


def test_remove_peer_forgets_outstanding_probes() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, fail_after=1)
    tracker.poll()
    tracker.remove_peer("b")
    clock.advance(10)
    probes, events = tracker.poll()
    assert probes == [] and events == [] and tracker.peers == []
    assert tracker.next_deadline() is None


def test_readding_with_new_address_resets_stats() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock)
    tracker.poll()
    tracker.add_peer("b", ADDR)  # same address: kept
    assert tracker.stats("b").sent == 1
    tracker.add_peer("b", ("10.0.0.3", 7000))
    assert tracker.stats("b").sent == 0


def test_next_deadline_covers_probes_and_timeouts() -> None:
    clock = FakeClock(100.0)
    tracker = make(clock, interval_s=1.0, timeout_s=0.3)
    assert tracker.next_deadline() == 100.0
    tracker.poll()
    assert tracker.next_deadline() == pytest.approx(100.3)


def test_a_late_caller_does_not_burst() -> None:
    clock = FakeClock(0.0)
    tracker = make(clock, interval_s=1.0)
    tracker.poll()
    clock.advance(10.0)
    assert len(tracker.poll()[0]) == 1
    assert tracker.next_deadline() is not None


@pytest.mark.parametrize("kw", [{"interval_s": 0}, {"fail_after": 0}, {"ewma_alpha": 0},
                                {"min_window_s": 0}])
def test_rejects_bad_parameters(kw: dict[str, float]) -> None:
    with pytest.raises(ValueError):
        LinkTracker(**kw)  # type: ignore[arg-type]


def test_detection_bound_formula() -> None:
    assert LinkTracker().detection_bound_s == pytest.approx(4.0)
    assert LinkTracker(interval_s=0.5, fail_after=4, timeout_s=0.2).detection_bound_s == 2.2
