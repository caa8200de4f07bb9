"""Prometheus metrics of one chaosd (``[metrics] listen``), served with ``prometheus-client``.

Every value is written on the daemon's event loop: the hooks below run in the handlers that
learn something (a worker's poll or report, a merged event), and :meth:`AgentMetrics.update`
copies the rest (links, suspicion, term, the daemon's counters) once a second from the tick.
The HTTP server is ``prometheus_client``'s own, on a thread of its own: a scrape only reads
the metric objects, which lock themselves, so it never touches the agent's state and a slow
scraper never blocks the loop. Each daemon has its own registry, so nothing of the process
(the library's default collectors, a test's other daemons) leaks into it.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any, Protocol
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from daemon.contracts.errors import ChaosError
from daemon.contracts.messages import Event
from daemon.contracts.protocol import Report, Stall


class Source(Protocol):
    """What :meth:`AgentMetrics.update` reads of the agent (a NodeAgent); a protocol, so
    that the agent may import this module without a cycle."""

    @property
    def election(self) -> Any: ...
    @property
    def role(self) -> Any: ...
    @property
    def counters(self) -> Mapping[str, int]: ...
    @property
    def detector(self) -> Any: ...
    @property
    def monitor(self) -> Any: ...

log = logging.getLogger("chaosd.metrics")
UPDATE_EVERY_S = 1.0
MAX_TIMINGS = 1000  # per poll: a worker that polled nothing for long sends a bounded list
# A step's collectives and stall range from under a millisecond (loopback) to tens of seconds
# (a rerun after a failure waits out the round timeout).
STEP_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                10.0, 30.0, 60.0)
# Scale events take from milliseconds (a scale-in) to minutes (a large state pulled slowly).
EVENT_BUCKETS = (0.001, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
                 300.0, 600.0)


def parse_listen(listen: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` for IPv6) as ``(host, port)``.

    Raises:
        ValueError: not of that form, or the port is not 1..65535.
    """
    host, sep, port = listen.rpartition(":")
    host = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{listen!r} is not host:port with a port in 1..65535")
    return host, int(port)


class AgentMetrics:
    """The metric families of one daemon, and the server that exposes them."""

    def __init__(self, listen: str) -> None:
        self.listen = listen
        self.registry = r = CollectorRegistry(auto_describe=True)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self._since = time.time()  # events recorded before we started are not ours to count
        self._last_update = float("-inf")
        self._counted: dict[str, int] = {}  # the daemon's counters as last exported
        self._peers: dict[str, set[str]] = {"link": set(), "phi": set()}

        self.steps = Counter("chaos_steps", "Training steps the local worker committed while "
                             "active (rate() is the step rate).", registry=r)
        self.step = Gauge("chaos_step", "The local worker's last committed step.", registry=r)
        self.allreduce = Histogram(
            "chaos_allreduce_seconds", "Time of each step in the collectives (agreement and "
            "all-reduce, waits for peers included), as the worker reports it.",
            buckets=STEP_BUCKETS, registry=r)
        self.stall = Histogram(
            "chaos_stall_seconds", "Stall of the first step under each new policy and of "
            "steps with reruns (time beyond the collectives), as the worker reports it.",
            buckets=STEP_BUCKETS, registry=r)
        self.reruns = Counter("chaos_round_reruns", "Rounds aborted and rerun before a step "
                              "committed.", registry=r)
        self.events = Counter("chaos_cluster_events", "Cluster events this daemon saw "
                              "recorded since it started, by kind (every daemon mirrors the "
                              "same log: take max(), not sum(), across daemons).", ["kind"],
                              registry=r)
        self.event_delay = Histogram(
            "chaos_cluster_event_delay_seconds", "Delay of each cluster event that has one "
            "(scale-out: request to active; scale-in, link changes: request to new policy; "
            "node-failed: silence), by kind.", ["kind"], buckets=EVENT_BUCKETS, registry=r)
        self.rtt = Gauge("chaos_link_rtt_seconds", "Smoothed RTT of the link to each "
                         "overlay neighbour, from the probes.", ["peer"], registry=r)
        self.bandwidth = Gauge("chaos_link_bandwidth_bytes_per_second", "Last measured "
                               "bandwidth of the link to each neighbour.", ["peer"], registry=r)
        self.link_up = Gauge("chaos_link_up", "1 while the link to a neighbour answers probes, "
                             "else 0.", ["peer"], registry=r)
        self.phi = Gauge("chaos_peer_phi", "Phi-accrual suspicion of each peer daemon (it is "
                         "declared failed at detector.phi_threshold).", ["peer"], registry=r)
        self.term = Gauge("chaos_scheduler_term", "The scheduler term this node accepts.",
                          registry=r)
        self.is_scheduler = Gauge("chaos_scheduler", "1 while this node is the elected "
                                  "scheduler, else 0.", registry=r)
        self.auth_failures = Counter("chaos_auth_failures", "Control messages dropped because "
                                     "they failed authentication.", registry=r)
        self.counters = Counter("chaos_daemon_counter", "The daemon's own counts by kind "
                                "(auth_failed, rejected, fenced, commands, tick_errors, ...).",
                                ["kind"], registry=r)

    # --- the server -----------------------------------------------------------------------
    @property
    def serving(self) -> bool:
        return self._server is not None

    def start(self) -> None:
        """Listen on ``listen`` (no-op when empty or already serving).

        Raises:
            ChaosError: the address cannot be bound (in use, not ours), in one line.
        """
        if not self.listen or self._server is not None:
            return
        host, port = parse_listen(self.listen)
        try:
            self._server, self._thread = start_http_server(port, host, registry=self.registry)
        except OSError as exc:
            raise ChaosError(f"metrics: cannot listen on {self.listen}: {exc.strerror or exc}"
                             ) from None
        self._thread.name = "chaos-metrics"
        log.info("metrics on http://%s/metrics", self.listen)

    def stop(self) -> None:
        """Stop serving and close the socket (the thread ends within its 0.5 s poll)."""
        server, self._server = self._server, None
        if server is None:
            return
        def close() -> None:
            server.shutdown()
            server.server_close()

        # shutdown() waits for serve_forever to notice: off the loop, in its own thread.
        threading.Thread(target=close, name="chaos-metrics-stop", daemon=True).start()

    # --- hooks ----------------------------------------------------------------------------
    def polled(self, before: tuple[int, str], after: tuple[int, str], args: dict[str, Any]
               ) -> None:
        """A worker's poll: ``(step, state)`` before and after, and its step timings."""
        self.step.set(after[0])
        # Only an active worker's progress counts: one that restores a state jumps to the
        # cluster's step while joining, which is no training of its own.
        if before[1] == after[1] == "active" and after[0] > before[0]:
            self.steps.inc(after[0] - before[0])
        sync = args.get("sync_ms")
        if isinstance(sync, list):
            for ms in sync[:MAX_TIMINGS]:
                if isinstance(ms, (int, float)) and not isinstance(ms, bool) and ms >= 0:
                    self.allreduce.observe(ms / 1000.0)

    def reported(self, rep: Report) -> None:
        """A worker's report; ``stall`` ones carry a step's stall and its reruns."""
        if not isinstance(rep, Stall):
            return
        if rep.ms >= 0:
            self.stall.observe(rep.ms / 1000.0)
        if rep.reruns > 0:
            self.reruns.inc(rep.reruns)

    def new_events(self, events: Iterable[Event]) -> None:
        """Events this daemon has just learned of (each is passed once)."""
        for ev in events:
            if ev.ts < self._since:
                continue
            self.events.labels(ev.kind).inc()
            if ev.delay_ms is not None and ev.delay_ms >= 0:
                self.event_delay.labels(ev.kind).observe(ev.delay_ms / 1000.0)

    def update(self, agent: Source, now: float) -> None:
        """Copy what the agent holds into the gauges; at most once per second."""
        if now - self._last_update < UPDATE_EVERY_S:
            return
        self._last_update = now
        self.term.set(agent.election.term)
        self.is_scheduler.set(1 if agent.role is not None else 0)
        for kind, value in list(agent.counters.items()):
            delta = value - self._counted.get(kind, 0)
            if delta > 0:
                self.counters.labels(kind).inc(delta)
                if kind == "auth_failed":
                    self.auth_failures.inc(delta)
            self._counted[kind] = value
        self._set("phi", {p: agent.detector.phi(p) for p in agent.detector.known()},
                  [self.phi])
        links: dict[str, tuple[float | None, float | None, bool]] = {}
        mon = agent.monitor
        if mon is not None:
            for peer, stats in mon.prober.snapshot().items():
                mbps = mon.bandwidths.get(peer)
                links[peer] = (stats.rtt_ewma_s, None if mbps is None else mbps * 1e6 / 8,
                               stats.state == "up")
        for peer, (rtt, bps, up) in links.items():
            self.link_up.labels(peer).set(1 if up else 0)
            if rtt is not None:
                self.rtt.labels(peer).set(rtt)
            if bps is not None:
                self.bandwidth.labels(peer).set(bps)
        self._forget("link", set(links), [self.rtt, self.bandwidth, self.link_up])

    def _set(self, group: str, values: dict[str, float], gauges: list[Gauge]) -> None:
        for peer, value in values.items():
            for gauge in gauges:
                gauge.labels(peer).set(value)
        self._forget(group, set(values), gauges)

    def _forget(self, group: str, now: set[str], gauges: list[Gauge]) -> None:
        """Drop the series of peers that are gone, so a departed neighbour leaves no stale
        value behind."""
        for peer in self._peers[group] - now:
            for gauge in gauges:
                with contextlib.suppress(KeyError):  # never set (an RTT not measured yet)
                    gauge.remove(peer)
        self._peers[group] = now
