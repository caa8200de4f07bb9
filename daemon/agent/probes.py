"""The cluster monitor's eyes on this node (paper IV-A): netprobe wired into chaosd.

Each daemon answers RTT probes (UDP) and bandwidth tests (iperf3 with ``--json``, or
netprobe's bulk probe where iperf3 is missing) on its advertised address, and probes the
links to its overlay neighbours: RTT continuously, bandwidth periodically at a low duty cycle
and on demand (``chaosctl probe``, joins). What it learns goes to the scheduler as reports; a
neighbour whose probes keep failing is reported as a failed link (disconnect-link).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from daemon.contracts.config import ProbeConfig
from daemon.contracts.protocol import LinkFailed, LinkMetrics, LinkRecovered
from netprobe import (
    BandwidthProber,
    IperfError,
    IperfMissing,
    NetprobeError,
    PeriodicBandwidthProbe,
    RttProber,
    RttResponder,
)
from netprobe.results import BandwidthResult

log = logging.getLogger("chaosd.probes")
ONE_SHOT_PROBES = 5
ONE_SHOT_INTERVAL_S = 0.05
ON_DEMAND_TEST_S = 1.0


@dataclass(frozen=True)
class PeerEndpoint:
    host: str
    probe_port: int
    bw_port: int
    bw_kind: str


#: Free ports tried for the iperf3 server when ``bw_port`` is 0: the port is free when picked
#: and taken again only when iperf3 binds it, so another process can take it in between.
PORT_TRIES = 5


def _free_tcp_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


class LinkMonitor:
    """Probe servers for peers, and probes of our neighbour links.

    Args:
        cfg: the ``[probe]`` config.
        host: the advertised address (probes bind and are reached there).
        report: called with each report for the scheduler (``link-failed``,
            ``link-recovered``, ``link-metrics``).
    """

    def __init__(self, cfg: ProbeConfig, host: str,
                 report: Callable[[LinkFailed | LinkRecovered | LinkMetrics], object]) -> None:
        self.cfg = cfg
        self.host = host
        self.report = report
        self.bandwidth = BandwidthProber(binary=cfg.iperf3)
        self.responder = RttResponder(host, 0)
        self.bw_port = cfg.bw_port or (_free_tcp_port(host) if self.bandwidth.kind == "iperf3"
                                       else 0)
        self._bw_server: Any = None
        self.prober = RttProber(bind_host=host, interval_s=cfg.rtt_interval_s,
                                fail_after=cfg.fail_after, on_fail=self._on_fail,
                                on_recover=self._on_recover)
        # A period of 0 turns the background tests off (a metered link, or a bench whose
        # links must carry nothing but its own traffic); on-demand tests still run.
        self.periodic = PeriodicBandwidthProbe(
            self.bandwidth, period_s=cfg.bandwidth_period_s,
            on_result=self._on_bandwidth) if cfg.bandwidth_period_s > 0 else None
        self._peers: dict[str, PeerEndpoint] = {}
        # Links whose probes failed: the scheduler drops them from the overlay, but we keep
        # probing so that a healed link is reported and connected again.
        self._failed: dict[str, PeerEndpoint] = {}
        self._last_rtt_report = 0.0
        self.bandwidths: dict[str, float] = {}  # peer -> last measured Mbit/s (metrics)

    @property
    def probe_port(self) -> int:
        return self.responder.port

    async def start(self) -> None:
        await self.responder.start()
        for attempt in range(1, PORT_TRIES + 1):
            server = self.bandwidth.make_server(self.host, self.bw_port)
            try:
                await server.start()
                break
            except IperfMissing:
                raise
            except IperfError as exc:
                # A chosen port is the operator's: its failure is theirs to see. One we picked
                # was taken between picking and binding (a suite's chaosd, say): pick again.
                if self.cfg.bw_port or attempt == PORT_TRIES:
                    raise
                log.warning("%s; trying another free port", exc)
                self.bw_port = _free_tcp_port(self.host)
        self._bw_server = server
        if not self.bw_port:
            self.bw_port = int(getattr(server, "port", 0))
        await self.prober.start()
        if self.periodic is not None:
            await self.periodic.start()
        log.info("probes: rtt on udp/%d, %s on tcp/%d", self.probe_port, self.bandwidth.kind,
                 self.bw_port)

    async def stop(self) -> None:
        for part in (self.periodic, self.prober, self._bw_server, self.responder):
            if part is not None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(part.stop(), timeout=5)

    def sync(self, peers: dict[str, PeerEndpoint]) -> None:
        """Probe these neighbour links, and the failed ones (called when the overlay changes)."""
        peers = {**self._failed, **peers}
        for peer in set(self._peers) - set(peers):
            self.prober.remove_peer(peer)
            if self.periodic is not None:
                self.periodic.remove_link(peer)
            self.bandwidths.pop(peer, None)
        for peer, ep in peers.items():
            if self._peers.get(peer) != ep and ep.probe_port:
                self.prober.add_peer(peer, ep.host, ep.probe_port)
                if ep.bw_port and ep.bw_kind and self.periodic is not None:
                    self.periodic.add_link(peer, ep.host, ep.bw_port,
                                           peer_kind=ep.bw_kind)  # type: ignore[arg-type]
        self._peers = dict(peers)

    def tick(self, every_s: float = 5.0) -> None:
        """Send the RTT of every neighbour link to the scheduler now and then: the smallest
        of the last seconds, the path's own delay, which a round pays a hop. The smoothed one
        carries the queueing our own bandwidth tests add, and the straggler judge blamed a
        link for its 17.8 ms under iperf3 (0.4 ms idle) while a link not timed yet counted 0."""
        now = time.monotonic()
        if now - self._last_rtt_report < every_s:
            return
        self._last_rtt_report = now
        for peer, stats in self.prober.snapshot().items():
            if stats.rtt_min_s is not None and stats.state == "up":
                self.report(LinkMetrics(peer=peer, rtt_ms=round(stats.rtt_min_s * 1000, 3)))

    def _on_fail(self, stats: Any) -> None:
        ep = self._peers.get(stats.peer)
        if ep is not None:
            self._failed[stats.peer] = ep
        self.report(LinkFailed(peer=stats.peer, reason="probe"))

    def _on_recover(self, stats: Any) -> None:
        log.info("link to %s answers probes again", stats.peer)
        if self._failed.pop(stats.peer, None) is not None:
            self.report(LinkRecovered(peer=stats.peer))

    def _on_bandwidth(self, peer: str, result: BandwidthResult) -> None:
        self.bandwidths[peer] = result.mbps
        self.report(LinkMetrics(peer=peer, bandwidth_mbps=round(result.mbps, 3)))

    async def rtts(self, peers: dict[str, PeerEndpoint]) -> dict[str, float]:
        """RTT in ms to each peer, from a short burst of probes to all of them at once."""
        one = RttProber(bind_host=self.host, interval_s=ONE_SHOT_INTERVAL_S,
                        fail_after=ONE_SHOT_PROBES + 1)
        await one.start()
        out: dict[str, float] = {}
        try:
            for peer, ep in peers.items():
                if ep.probe_port:
                    one.add_peer(peer, ep.host, ep.probe_port)
            await asyncio.sleep(ONE_SHOT_INTERVAL_S * (ONE_SHOT_PROBES + 1))
            for peer, stats in one.snapshot().items():
                if stats.rtt_ewma_s is not None:
                    out[peer] = round(stats.rtt_ewma_s * 1000, 3)
        finally:
            await one.stop()
        return out

    async def probe(self, peer: str, ep: PeerEndpoint, nbytes: int | None = None,
                    reverse: bool = False) -> dict[str, Any]:
        """A fresh measurement of the path to ``peer``: RTT, then a bandwidth test of 1 s (or
        of ``nbytes``), from us to it or, with ``reverse``, from it to us."""
        rtt_ms = (await self.rtts({peer: ep})).get(peer)
        bw = None
        method = self.bandwidth.kind if ep.bw_kind in ("", self.bandwidth.kind) else ep.bw_kind
        error = None
        if ep.bw_port:
            try:
                res = await self.bandwidth.measure(ep.host, ep.bw_port, nbytes=nbytes,
                                                   duration_s=None if nbytes else
                                                   ON_DEMAND_TEST_S, reverse=reverse,
                                                   peer_kind=ep.bw_kind or None)  # type: ignore[arg-type]
                bw = round(res.mbps, 3)
                self.bandwidths[peer] = res.mbps
            except NetprobeError as exc:
                error = str(exc)
        out = {"peer": peer, "rtt_ms": rtt_ms, "bandwidth_mbps": bw, "method": method,
               "measured_at": time.time()}
        if error:
            out["error"] = error
        return out
