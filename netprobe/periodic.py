"""Low-duty-cycle background bandwidth probing of every neighbour link.

The paper measures bandwidth only on demand (scale-out, connect-link) because iperf is costly.
Between those, links are re-shaped every few minutes (section VI-A), so the planner's figures go
stale. This module keeps them fresh with a short test per link per period.

Probe size and duty cycle. One probe of ``n`` bytes per ``period_s`` on a link of capacity C
bit/s takes this share of the link in the steady state::

    duty = n * 8 / (C * period_s)

A probe that is too short mostly measures TCP slow start and the shaper's bucket, so each link's
probe is sized to a target duty cycle from its current capacity estimate (the median of the last
three results, or the capacity hint given), clamped to ``[nbytes, max_nbytes]``::

    n = clamp(C / 8 * period_s * target_duty, 256 KiB, 16 MiB)          (defaults)

With the defaults (every 60 s, target 0.1 %):

    C = 1000 Mbit/s -> n = 7.5 MB   -> duty 0.1 %
    C =  100 Mbit/s -> n = 750 kB   -> duty 0.1 %
    C =   10 Mbit/s -> n = 256 KiB  -> duty 2,097,152 / (10e6 * 60) = 0.35 %  (the floor)

so the duty cycle is 0.1 % for every link of 35 Mbit/s or more and stays under 1 % down to
2,097,152 / (0.01 * 60) bit/s = 3.5 Mbit/s: the paper's 100-1000 Mbit/s range has a tenfold
margin. If the estimate is k times too high the probe is k times too big, so the duty cycle is
k * 0.1 %, and never more than 16 MiB per period. The very first probe of a link, before any
estimate, uses the floor; when a probe comes out :data:`RAMP_FACTOR` times smaller than the
size its own result calls for (a fast link read through a probe too short for it: the
period's size, or a test of :data:`ACCURATE_S` at the rate read if that is smaller), the
link is probed again within seconds at that size, and the new reading replaces the old one.
A reading :data:`SHIFT_FACTOR` times off the estimate (a rate that changed, or a misreading)
is retested within seconds as well; if the retest agrees, the old readings are dropped.
``chaosctl bench duty-cycle`` measures the real cost on the wire,
headers, ACKs and iperf3's control connection included.

Treat the periodic figure as a freshness signal; scale-out and connect-link still run a longer
test on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from netprobe.bandwidth import BandwidthProber, ServerKind
from netprobe.errors import NetprobeError
from netprobe.results import BandwidthResult

log = logging.getLogger(__name__)

DEFAULT_PERIOD_S = 60.0
DEFAULT_NBYTES = 256 * 1024
DEFAULT_MAX_NBYTES = 16 * 1024 * 1024
DEFAULT_TARGET_DUTY = 0.001
# A link's first test, failed, is tried again this soon, this many times, then once a period.
FIRST_RETRY_S = 2.0
FIRST_TRIES = 5
# A probe this many times smaller than the size its own result calls for measured mostly the
# test's set-up and TCP slow start (a link's first, 256 KiB, read loopback as a few hundred
# Mbit/s): the link is probed again soon, at the new size, and that reading replaces it.
RAMP_FACTOR = 4
# What "its size" means for that repeat: a test that lasts this long at the rate it read, so
# set-up and slow start no longer dominate it, and never more than the period's size. The
# period's size alone would be the 16 MiB cap with a long period (a day): a 20 Mbit/s link's
# 256 KiB first test, already accurate, was repeated at 16 MiB (about 7 s of iperf3 inside a
# training run's steps).
ACCURATE_S = 0.25
# A reading this many times off the link's estimate, either way, is a rate that changed (a box
# moved to Wi-Fi, an evening uplink) or a misreading: the link is tested again within
# FIRST_RETRY_S, so the scheduler holds a second, independent reading within seconds rather
# than a period later (the policy controller counts only new readings), and a change the
# retest confirms replaces the estimate at once.
SHIFT_FACTOR = 4


def probe_size(
    capacity_bps: float | None,
    period_s: float,
    *,
    target_duty: float | None = DEFAULT_TARGET_DUTY,
    min_nbytes: int = DEFAULT_NBYTES,
    max_nbytes: int = DEFAULT_MAX_NBYTES,
) -> int:
    """Bytes for one probe: ``capacity/8 * period * target_duty`` clamped to the bounds.

    Without a capacity estimate or a target, the probe is ``min_nbytes``.
    """
    if not capacity_bps or target_duty is None:
        return min_nbytes
    return int(min(max(capacity_bps / 8 * period_s * target_duty, min_nbytes), max_nbytes))


def expected_duty_cycle(nbytes: int, period_s: float, capacity_bps: float) -> float:
    """The steady-state share of a link's capacity one probe per period uses (0.01 = 1 %)."""
    return nbytes * 8 / (capacity_bps * period_s)


@dataclass
class LinkProbeStats:
    """What the periodic prober knows about one link.

    Attributes:
        peer: The link's peer.
        last: The latest successful result, or None.
        last_at: ``time.monotonic()`` of the latest result.
        probes: Successful probes.
        failures: Failed probes (the link may be down; the RTT prober decides that).
        probe_bytes: Payload bytes moved by successful probes.
        probe_seconds: Time the link spent carrying probes (receiver-timed).
        capacity_bps: Capacity estimate used for sizing and the duty cycle: the hint given,
            else the median of the last three results.
        next_nbytes: Size of the next probe.
        undersized: The last probe was :data:`RAMP_FACTOR` times smaller than the size its
            result calls for; the next one comes soon and replaces its reading.
        shifted: The last reading was :data:`SHIFT_FACTOR` times off the estimate before it;
            the next test comes soon, and if it is off too, the old readings are dropped.
    """

    peer: str
    last: BandwidthResult | None = None
    last_at: float | None = None
    probes: int = 0
    failures: int = 0
    probe_bytes: int = 0
    probe_seconds: float = 0.0
    capacity_bps: float | None = None
    next_nbytes: int = DEFAULT_NBYTES
    undersized: bool = False  # the last probe was RAMP_FACTOR times too small for its result
    shifted: bool = False  # the last reading was SHIFT_FACTOR off the estimate: retest soon
    _recent_bps: deque[float] = field(default_factory=lambda: deque(maxlen=3), repr=False)
    _period_s: float = field(default=DEFAULT_PERIOD_S, repr=False)

    @property
    def duty_cycle(self) -> float | None:
        """Measured probe bytes / (capacity * elapsed periods); None before the first probe."""
        if not self.probes or not self.capacity_bps:
            return None
        return self.probe_bytes * 8 / (self.capacity_bps * self.probes * self._period_s)

    @property
    def time_duty_cycle(self) -> float | None:
        """Share of wall time the link was busy with probes; None before the first probe."""
        if not self.probes:
            return None
        return self.probe_seconds / (self.probes * self._period_s)


@dataclass
class _Link:
    host: str
    port: int
    peer_kind: ServerKind | None
    capacity_hint: float | None
    stats: LinkProbeStats
    task: asyncio.Task[None] | None = None


class PeriodicBandwidthProbe:
    """Runs one short bandwidth test per link every ``period_s`` seconds.

    Args:
        prober: The tool facade that runs each test.
        period_s: Time between two tests of the same link.
        nbytes: Smallest probe, and the size of a link's first probe.
        target_duty: Share of each link's capacity to spend on probing (None: always ``nbytes``);
            see the module docstring for the arithmetic.
        max_nbytes: Largest probe.
        jitter: Each wait is drawn from ``period_s * [1 - jitter, 1 + jitter]`` so that nodes do
            not probe in lock step (and collide on iperf3's one-test-at-a-time servers).
        timeout_s: Deadline of one test.
        on_result: Called with ``(peer, result)`` after every successful test.
        on_error: Called with ``(peer, error)`` after every failed test.
    """

    def __init__(
        self,
        prober: BandwidthProber,
        *,
        period_s: float = DEFAULT_PERIOD_S,
        nbytes: int = DEFAULT_NBYTES,
        target_duty: float | None = DEFAULT_TARGET_DUTY,
        max_nbytes: int = DEFAULT_MAX_NBYTES,
        jitter: float = 0.1,
        timeout_s: float = 10.0,
        on_result: Callable[[str, BandwidthResult], None] | None = None,
        on_error: Callable[[str, NetprobeError], None] | None = None,
    ) -> None:
        if period_s <= 0 or not 0 < nbytes <= max_nbytes or not 0 <= jitter < 1:
            raise ValueError("need period_s > 0, 0 < nbytes <= max_nbytes and 0 <= jitter < 1")
        if target_duty is not None and not 0 < target_duty < 1:
            raise ValueError("target_duty must be in (0, 1)")
        self.prober = prober
        self.period_s = period_s
        self.nbytes = nbytes
        self.target_duty = target_duty
        self.max_nbytes = max_nbytes
        self.jitter = jitter
        self.timeout_s = timeout_s
        self.on_result = on_result
        self.on_error = on_error
        self._links: dict[str, _Link] = {}
        self._retired: set[asyncio.Task[None]] = set()
        self._running = False

    def add_link(
        self,
        peer: str,
        host: str,
        port: int,
        *,
        capacity_bps: float | None = None,
        peer_kind: ServerKind | None = None,
    ) -> None:
        """Start probing the link to ``peer``; the first test runs at once if started.

        Args:
            peer: The link's peer identifier.
            host: The peer's address.
            port: The peer's probe server port.
            capacity_bps: The link's nominal capacity, if known, for probe sizing and the duty
                cycle (else the measured rate is used).
            peer_kind: The peer's tool (see :class:`~netprobe.bandwidth.BandwidthProber`).
        """
        self.remove_link(peer)
        stats = LinkProbeStats(peer, capacity_bps=capacity_bps, _period_s=self.period_s)
        stats.next_nbytes = self._size(capacity_bps)
        link = _Link(host, port, peer_kind, capacity_bps, stats)
        self._links[peer] = link
        if self._running:
            link.task = asyncio.create_task(self._probe_loop(link), name=f"bwprobe-{peer}")

    def remove_link(self, peer: str) -> None:
        """Stop probing ``peer``'s link (unknown peers are ignored)."""
        link = self._links.pop(peer, None)
        if link is not None and link.task is not None:
            link.task.cancel()
            self._retired.add(link.task)  # awaited in stop(), never left dangling
            link.task.add_done_callback(self._retired.discard)

    def stats(self, peer: str) -> LinkProbeStats:
        """The probe statistics of ``peer``'s link (KeyError if unknown)."""
        return self._links[peer].stats

    async def start(self) -> None:
        """Start a probing task for every link added so far (and for later ones)."""
        self._running = True
        for peer, link in self._links.items():
            if link.task is None:
                link.task = asyncio.create_task(self._probe_loop(link), name=f"bwprobe-{peer}")

    async def stop(self) -> None:
        """Cancel every probing task and wait for them; any test in flight is killed."""
        self._running = False
        tasks = [link.task for link in self._links.values() if link.task is not None]
        tasks += self._retired
        for link in self._links.values():
            link.task = None
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def probe_once(self, peer: str) -> BandwidthResult | None:
        """Run one test of ``peer``'s link now and record it; None if it failed."""
        link = self._links[peer]
        stats = link.stats
        try:
            result = await self.prober.measure(
                link.host,
                link.port,
                nbytes=stats.next_nbytes,
                timeout_s=self.timeout_s,
                peer_kind=link.peer_kind,
            )
        except NetprobeError as exc:
            stats.failures += 1
            log.info("periodic bandwidth probe to %s failed: %s", peer, exc)
            on_error, error = self.on_error, exc
            if on_error is not None:
                _call_safely(lambda: on_error(peer, error))
            return None
        stats.last, stats.last_at = result, time.monotonic()
        stats.probes += 1
        stats.probe_bytes += result.bytes
        stats.probe_seconds += result.seconds
        if link.capacity_hint is None:
            bps, est = result.bits_per_second, stats.capacity_bps
            off = (not stats.undersized and est is not None and bps > 0
                   and max(bps / est, est / bps) >= SHIFT_FACTOR)
            if stats.undersized:  # the last reading came from too short a probe
                stats._recent_bps.clear()
            elif off and stats.shifted:  # the retest confirms the change: the old level is gone
                previous = stats._recent_bps[-1]
                stats._recent_bps.clear()
                stats._recent_bps.append(previous)
            stats.shifted = off and not stats.shifted
            # The median damps one-off misreadings (a shaper's burst, a slow start).
            stats._recent_bps.append(bps)
            stats.capacity_bps = statistics.median(stats._recent_bps)
        stats.next_nbytes = self._size(stats.capacity_bps)
        accurate = min(stats.next_nbytes, int(result.bits_per_second / 8 * ACCURATE_S))
        stats.undersized = accurate >= RAMP_FACTOR * result.bytes
        if stats.undersized:
            stats.next_nbytes = accurate  # the repeat; then the period's size again
        on_result = self.on_result
        if on_result is not None:
            _call_safely(lambda: on_result(peer, result))
        return result

    def _size(self, capacity_bps: float | None) -> int:
        return probe_size(
            capacity_bps,
            self.period_s,
            target_duty=self.target_duty,
            min_nbytes=self.nbytes,
            max_nbytes=self.max_nbytes,
        )

    async def _probe_loop(self, link: _Link) -> None:
        while True:
            ok = await self.probe_once(link.stats.peer) is not None
            wait = self.period_s
            if not ok and link.stats.probes == 0 and link.stats.failures <= FIRST_TRIES:
                # A link never measured yet: its first test failed, most often on a server
                # busy with another node's first test (boxes that start together probe at
                # once). Until it is measured the scheduler cannot use it, so try again soon.
                wait = min(self.period_s, FIRST_RETRY_S)
            elif ok and (link.stats.undersized or link.stats.shifted):
                wait = min(self.period_s, FIRST_RETRY_S)  # measure it again (at its size)
            await asyncio.sleep(wait * random.uniform(1 - self.jitter, 1 + self.jitter))


def _call_safely(fn: Callable[[], object]) -> None:
    # A broken observer must not stop the probing loop.
    try:
        fn()
    except Exception:
        log.exception("periodic bandwidth probe callback raised; ignored")
