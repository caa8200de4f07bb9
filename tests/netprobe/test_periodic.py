"""Periodic low-duty-cycle probing and the LinkEstimate handed to the planner."""

from __future__ import annotations

import asyncio
import itertools
import statistics

import pytest

from netprobe.bandwidth import BandwidthProber
from netprobe.bulk import BulkProbeServer
from netprobe.errors import NetprobeError
from netprobe.periodic import (
    DEFAULT_MAX_NBYTES,
    DEFAULT_NBYTES,
    DEFAULT_PERIOD_S,
    DEFAULT_TARGET_DUTY,
    PeriodicBandwidthProbe,
    expected_duty_cycle,
    probe_size,
)
from netprobe.results import BandwidthResult, LinkEstimate

pytestmark = pytest.mark.timeout(60)

LOCAL = "127.0.0.1"


def test_default_probe_sizes_keep_duty_under_one_percent() -> None:
    def duty(mbps: float) -> float:
        c = mbps * 1e6
        return expected_duty_cycle(probe_size(c, DEFAULT_PERIOD_S), DEFAULT_PERIOD_S, c)

    # The paper's 100-1000 Mbit/s links get exactly the 0.1 % target.
    for mbps in (35, 100, 500, 1000):
        assert duty(mbps) == pytest.approx(DEFAULT_TARGET_DUTY, rel=1e-3)
    # Slow links hit the 256 KiB floor: still under 1 % down to 3.5 Mbit/s, as documented.
    assert duty(10) == pytest.approx(DEFAULT_NBYTES * 8 / (10e6 * 60))
    assert duty(3.5) < 0.01 < duty(3.4)
    # Very fast links hit the 16 MiB ceiling and spend less than the target.
    assert probe_size(100e9, DEFAULT_PERIOD_S) == DEFAULT_MAX_NBYTES
    # No estimate yet, or no target: the floor.
    assert probe_size(None, DEFAULT_PERIOD_S) == DEFAULT_NBYTES
    assert probe_size(1e9, DEFAULT_PERIOD_S, target_duty=None) == DEFAULT_NBYTES


async def test_probe_size_follows_the_measured_capacity() -> None:
    seen: list[float] = []
    prober = BandwidthProber(binary="iperf3-not-here-periodic")
    async with BulkProbeServer(LOCAL, 0) as server:
        periodic = PeriodicBandwidthProbe(
            prober,
            period_s=1.0,
            nbytes=4096,
            max_nbytes=1 << 20,
            target_duty=0.01,
            on_result=lambda peer, r: seen.append(r.bits_per_second),
        )
        periodic.add_link("b", LOCAL, server.port, peer_kind="bulk")
        assert periodic.stats("b").next_nbytes == 4096  # no estimate yet
        short = False
        kept: list[float] = []
        for _ in range(4):
            assert await periodic.probe_once("b") is not None
            # A reading from a probe too short for it is replaced by the next one.
            kept = [seen[-1]] if not kept or short else [*kept, seen[-1]]
            short = periodic.stats("b").undersized
        stats = periodic.stats("b")
        # The capacity estimate is the median of the last three readings kept.
        assert stats.capacity_bps == statistics.median(kept[-3:])
        assert stats.next_nbytes == probe_size(
            stats.capacity_bps, 1.0, target_duty=0.01, min_nbytes=4096, max_nbytes=1 << 20
        )


async def test_periodic_probe_runs_every_period_and_reports_duty_cycle() -> None:
    results: list[tuple[str, BandwidthResult]] = []
    prober = BandwidthProber(binary="iperf3-not-here-periodic")
    async with BulkProbeServer(LOCAL, 0) as server:
        periodic = PeriodicBandwidthProbe(
            prober,
            period_s=0.2,
            nbytes=64 * 1024,
            jitter=0.0,
            on_result=lambda peer, r: results.append((peer, r)),
        )
        periodic.add_link("b", LOCAL, server.port, capacity_bps=1e9, peer_kind="bulk")
        await periodic.start()
        try:
            await asyncio.sleep(0.75)
        finally:
            await periodic.stop()
        stats = periodic.stats("b")
    assert 3 <= stats.probes <= 5
    assert len(results) == stats.probes and stats.failures == 0
    assert stats.probe_bytes == stats.probes * 64 * 1024
    # The measured duty cycle is the formula's, evaluated on what actually moved.
    assert stats.duty_cycle == pytest.approx(expected_duty_cycle(64 * 1024, 0.2, 1e9))
    assert stats.time_duty_cycle is not None and 0 < stats.time_duty_cycle < 1


async def test_failures_are_counted_and_reported(free_tcp_port: int) -> None:
    errors: list[NetprobeError] = []
    periodic = PeriodicBandwidthProbe(
        BandwidthProber(binary="iperf3-not-here-periodic"),
        period_s=0.1,
        on_error=lambda peer, exc: errors.append(exc),
    )
    periodic.add_link("gone", LOCAL, free_tcp_port, peer_kind="bulk")
    assert await periodic.probe_once("gone") is None
    stats = periodic.stats("gone")
    assert stats.failures == 1 and stats.duty_cycle is None and len(errors) == 1


async def test_links_added_and_removed_while_running() -> None:
    prober = BandwidthProber(binary="iperf3-not-here-periodic")
    async with BulkProbeServer(LOCAL, 0) as server:
        periodic = PeriodicBandwidthProbe(prober, period_s=0.1, nbytes=1024)
        await periodic.start()
        try:
            periodic.add_link("b", LOCAL, server.port, peer_kind="bulk")
            await asyncio.sleep(0.35)
            assert periodic.stats("b").probes >= 2
            periodic.remove_link("b")
            tests = server.tests
            await asyncio.sleep(0.3)
            assert server.tests <= tests + 1
        finally:
            await periodic.stop()


def test_bad_parameters_rejected() -> None:
    prober = BandwidthProber(binary="iperf3-not-here-periodic")
    for kw in ({"period_s": 0}, {"nbytes": 0}, {"jitter": 1.0}, {"target_duty": 2.0}):
        with pytest.raises(ValueError):
            PeriodicBandwidthProbe(prober, **kw)


def test_link_estimate_from_rtt_and_bandwidth() -> None:
    est = LinkEstimate.from_measurements(rtt_s=0.004, bits_per_second=100e6)
    assert est.t_prop_s == pytest.approx(0.002)
    assert est.t_trans_s_per_byte == pytest.approx(8e-8)
    # 100 MB over 100 Mbit/s: 8 s plus half the RTT.
    assert est.transfer_time_s(100_000_000) == pytest.approx(8.002)
    with pytest.raises(ValueError):
        LinkEstimate.from_measurements(0.001, 0)
    with pytest.raises(ValueError):
        LinkEstimate.from_measurements(-1, 1e6)


def test_bandwidth_result_mbps() -> None:
    assert BandwidthResult(bits_per_second=50e6, bytes=1, seconds=1).mbps == 50


async def test_a_first_test_that_fails_is_tried_again_long_before_the_period(
        free_tcp_port: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Boxes that start together probe each other at once, and a server busy with another
    test refuses: the link then waited a whole period (60 s) unmeasured, and the scheduler
    could not put it in the tree. Its first test is tried again soon, until it succeeds."""
    import netprobe.periodic as periodic_mod

    monkeypatch.setattr(periodic_mod, "FIRST_RETRY_S", 0.05)
    periodic = PeriodicBandwidthProbe(BandwidthProber(binary="iperf3-not-here-periodic"),
                                      period_s=60.0, nbytes=1024)
    periodic.add_link("b", LOCAL, free_tcp_port, peer_kind="bulk")
    await periodic.start()
    try:
        while periodic.stats("b").failures == 0:  # nothing listens yet: the first fails
            await asyncio.sleep(0.01)
        async with BulkProbeServer(LOCAL, free_tcp_port):
            for _ in range(500):  # a retry, not the period: the test's timeout bounds it
                if periodic.stats("b").probes:
                    break
                await asyncio.sleep(0.01)
            assert periodic.stats("b").probes == 1
    finally:
        await periodic.stop()


class _SlowStart:
    """A prober whose reading grows with the probe's size, as a fast link's does: a test's
    set-up and TCP slow start dominate a short one. The link carries 8 Gbit/s."""

    def __init__(self) -> None:
        self.sizes: list[int] = []

    async def measure(self, host: str, port: int, *, nbytes: int, timeout_s: float,
                      peer_kind: object) -> BandwidthResult:
        self.sizes.append(nbytes)
        seconds = 0.002 + nbytes * 8 / 8e9  # 2 ms of set-up, then the link's rate
        return BandwidthResult(nbytes * 8 / seconds, nbytes, seconds, tool="bulk")


async def test_a_probe_too_short_for_its_link_is_followed_at_once_by_one_at_its_size(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A fast link's first probe (the 256 KiB floor) read it under 1 Gbit/s: the link is
    probed again within seconds at the size that reading calls for, and again, until the
    size a reading calls for is less than four times the probe's; each new reading replaces
    the short one, so the estimate is the last, not a median dragged down by the first."""
    import netprobe.periodic as periodic_mod

    monkeypatch.setattr(periodic_mod, "FIRST_RETRY_S", 0.01)
    fake = _SlowStart()
    readings: list[float] = []
    periodic = PeriodicBandwidthProbe(fake, period_s=60.0, jitter=0.0,  # type: ignore[arg-type]
                                      on_result=lambda _peer, r: readings.append(r.mbps))
    periodic.add_link("b", LOCAL, 1, peer_kind="bulk")
    await periodic.start()
    try:
        for _ in range(500):  # a few quick probes, then the period: the timeout bounds it
            if len(fake.sizes) >= 3 and not periodic.stats("b").undersized:
                break
            await asyncio.sleep(0.01)
    finally:
        await periodic.stop()
    stats = periodic.stats("b")
    assert fake.sizes[0] == DEFAULT_NBYTES and fake.sizes == sorted(fake.sizes)
    assert all(b >= 4 * a for a, b in itertools.pairwise(fake.sizes))  # ramped, no repeats
    assert not stats.undersized and stats.next_nbytes < 4 * fake.sizes[-1]
    assert readings[0] < 1_000 and readings[-1] > 5_000  # Mbit/s
    assert stats.capacity_bps == pytest.approx(readings[-1] * 1e6)  # the short ones replaced


class _Shaped(_SlowStart):
    """A link of ``rate`` bit/s behind ``setup_s`` of test set-up."""

    def __init__(self, rate: float, setup_s: float) -> None:
        super().__init__()
        self.rate, self.setup_s = rate, setup_s

    async def measure(self, host: str, port: int, *, nbytes: int, timeout_s: float,
                      peer_kind: object) -> BandwidthResult:
        self.sizes.append(nbytes)
        seconds = self.setup_s + nbytes * 8 / self.rate
        return BandwidthResult(nbytes * 8 / seconds, nbytes, seconds, tool="bulk")


@pytest.mark.parametrize(("rate", "setup_s", "repeated"), [(20e6, 0.002, False),
                                                           (200e6, 0.02, True)],
                         ids=["slow-link", "fast-link"])
async def test_a_long_period_repeats_only_a_short_test_and_only_at_the_size_it_needs(
        rate: float, setup_s: float, repeated: bool) -> None:
    """With a day between tests the period's size is the 16 MiB cap. A 20 Mbit/s link's
    first 256 KiB test lasted 0.1 s and read the link right: it is not repeated (it was, at
    16 MiB: 7 s of iperf3 amid training). A faster link's first test read mostly set-up: it
    is repeated at what lasts ACCURATE_S at the rate it read, not at the cap."""
    from netprobe.periodic import ACCURATE_S

    fake = _Shaped(rate, setup_s)
    periodic = PeriodicBandwidthProbe(fake, period_s=86400.0,  # type: ignore[arg-type]
                                      jitter=0.0)
    periodic.add_link("b", LOCAL, 1, peer_kind="bulk")
    first = await periodic.probe_once("b")
    assert first is not None and fake.sizes == [DEFAULT_NBYTES]
    stats = periodic.stats("b")
    assert stats.undersized is repeated
    if repeated:
        want = int(first.bits_per_second / 8 * ACCURATE_S)
        assert 4 * DEFAULT_NBYTES <= stats.next_nbytes == want < DEFAULT_MAX_NBYTES
        assert await periodic.probe_once("b") is not None
        assert fake.sizes[1] == want and not stats.undersized
    assert stats.next_nbytes == DEFAULT_MAX_NBYTES  # then the period's size, a day on


async def test_a_rate_that_changes_is_retested_at_once_and_replaces_the_old_level(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A link read at 100 Mbit/s falls to 5 (a box moved to Wi-Fi). The first low reading
    alone is damped (the median of three keeps 100: it might be a misreading) but the link
    is tested again within FIRST_RETRY_S, not a period later: the scheduler then holds a
    second, independent reading within seconds, and once the retest confirms the change the
    estimate is the new level. A one-off misreading, retested, leaves the estimate alone."""
    import netprobe.periodic as periodic_mod

    monkeypatch.setattr(periodic_mod, "FIRST_RETRY_S", 0.01)
    fake = _Shaped(100e6, 0.0)
    readings: list[float] = []
    periodic = PeriodicBandwidthProbe(fake, period_s=60.0, jitter=0.0,  # type: ignore[arg-type]
                                      on_result=lambda _peer, r: readings.append(r.mbps))
    periodic.add_link("b", LOCAL, 1, peer_kind="bulk")
    for _ in range(3):
        await periodic.probe_once("b")
    stats = periodic.stats("b")
    assert stats.capacity_bps == pytest.approx(100e6) and not stats.shifted
    # A one-off misreading: retested, the old level stands.
    fake.rate = 5e6
    await periodic.probe_once("b")
    assert stats.shifted and stats.capacity_bps == pytest.approx(100e6)
    fake.rate = 100e6
    await periodic.probe_once("b")
    assert not stats.shifted and stats.capacity_bps == pytest.approx(100e6)
    # A change: the periodic loop retests it at once, and the estimate follows.
    fake.rate = 5e6
    await periodic.start()
    try:
        for _ in range(500):  # the timeout bounds it: the next period is a minute away
            if len(readings) >= 7:
                break
            await asyncio.sleep(0.01)
    finally:
        await periodic.stop()
    assert readings[-2:] == [pytest.approx(5.0), pytest.approx(5.0)]
    assert stats.capacity_bps == pytest.approx(5e6) and not stats.shifted
