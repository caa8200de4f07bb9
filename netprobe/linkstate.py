"""Per-link RTT bookkeeping and failure detection, with no I/O.

:class:`LinkTracker` is the pure state machine behind :class:`netprobe.rtt.RttProber`. It decides
when each peer is due for a probe, matches replies to probes by sequence number, keeps an EWMA of
the RTT, its minimum over a recent window, and the loss counters, and turns runs of missed
probes into ``failed`` / ``recovered`` events. Time comes from an injected
:class:`~netprobe.clock.Clock`, so tests drive it with a :class:`~netprobe.clock.FakeClock` and
never sleep.

Detection bound. Say the link dies at time D. The first probe sent after D leaves no later than
D + interval, the ``fail_after``-th no later than D + fail_after * interval, and that one is
declared missed ``timeout`` after it left. So a dead link is reported within::

    interval_s * fail_after + timeout_s        (defaults: 1.0 * 3 + 1.0 = 4 s)

plus the event loop's scheduling jitter. The bound depends on no other peer, so it does not grow
with the cluster's size (compare SWIM's 1 s probe and ~4 s suspicion on a LAN).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Literal

from netprobe.clock import Clock, SystemClock

_MAX_EXPIRED = 1024

LinkState = Literal["unknown", "up", "down"]
EventKind = Literal["failed", "recovered"]


@dataclass(frozen=True)
class PeerStats:
    """A snapshot of one peer link's measurements.

    Attributes:
        peer: The caller's identifier for the peer.
        addr: The ``(host, port)`` probes go to.
        state: ``unknown`` until the first reply or failure, then ``up`` or ``down``.
        rtt_ewma_s: Smoothed RTT in seconds (None before the first reply).
        rtt_last_s: The most recent RTT sample in seconds.
        rtt_min_s: The smallest RTT sample of the last ``min_window_s``: the path's own delay,
            without the queueing that traffic on it adds (an iperf3 test through a 5 Mbit/s
            shaper put 16-50 ms on echoes that take 0.4-0.7 ms idle), as BBR's min_rtt.
        sent: Probes sent.
        received: Replies matched to a probe in time.
        lost: Probes that timed out.
        late: Replies that came after their probe had already timed out.
        consecutive_misses: Timed-out probes since the last reply.
        last_reply_at: Clock reading of the last reply, or None.
    """

    peer: str
    addr: tuple[str, int]
    state: LinkState = "unknown"
    rtt_ewma_s: float | None = None
    rtt_last_s: float | None = None
    rtt_min_s: float | None = None
    sent: int = 0
    received: int = 0
    lost: int = 0
    late: int = 0
    consecutive_misses: int = 0
    last_reply_at: float | None = None

    @property
    def loss_ratio(self) -> float:
        """Fraction of settled probes (received + lost) that were lost; 0.0 before any."""
        settled = self.received + self.lost
        return self.lost / settled if settled else 0.0


@dataclass(frozen=True)
class Probe:
    """An instruction to send one probe: the tracker decided, the caller does the I/O."""

    peer: str
    addr: tuple[str, int]
    seq: int


@dataclass(frozen=True)
class LinkEvent:
    """A link changed state: ``failed`` after ``fail_after`` misses, ``recovered`` on a reply."""

    kind: EventKind
    stats: PeerStats


@dataclass
class _Peer:
    stats: PeerStats
    next_probe_at: float
    recent: deque[tuple[float, float]] = field(default_factory=deque)  # (when, RTT)


@dataclass
class _Outstanding:
    peer: str
    sent_at: float


@dataclass
class LinkTracker:
    """Schedules probes, matches replies and detects failed links for a set of peers.

    Args:
        interval_s: Time between two probes to the same peer.
        timeout_s: How long a probe may stay unanswered before it counts as missed.
        fail_after: Consecutive misses that mark a link ``down``.
        ewma_alpha: Weight of a new RTT sample (0.125, as TCP's SRTT in RFC 6298).
        min_window_s: How far back the minimum RTT looks.
        clock: Time source; the real monotonic clock by default.
    """

    interval_s: float = 1.0
    timeout_s: float = 1.0
    fail_after: int = 3
    ewma_alpha: float = 0.125
    min_window_s: float = 10.0
    clock: Clock = field(default_factory=SystemClock)
    _peers: dict[str, _Peer] = field(default_factory=dict, init=False, repr=False)
    _outstanding: dict[int, _Outstanding] = field(default_factory=dict, init=False, repr=False)
    _expired: dict[int, str] = field(default_factory=dict, init=False, repr=False)
    _next_seq: int = field(default=1, init=False, repr=False)

    def __post_init__(self) -> None:
        if self.interval_s <= 0 or self.timeout_s <= 0:
            raise ValueError("interval_s and timeout_s must be positive")
        if self.fail_after < 1:
            raise ValueError("fail_after must be at least 1")
        if not 0 < self.ewma_alpha <= 1:
            raise ValueError("ewma_alpha must be in (0, 1]")
        if self.min_window_s <= 0:
            raise ValueError("min_window_s must be positive")

    @property
    def detection_bound_s(self) -> float:
        """Worst-case time from a link dying to its ``failed`` event (see module docstring)."""
        return self.interval_s * self.fail_after + self.timeout_s

    @property
    def peers(self) -> list[str]:
        """The peers being probed."""
        return list(self._peers)

    def add_peer(self, peer: str, addr: tuple[str, int]) -> None:
        """Start probing ``peer`` at ``addr`` (its first probe is due at once).

        Adding a known peer with a new address resets its statistics.
        """
        known = self._peers.get(peer)
        if known is not None and known.stats.addr == addr:
            return
        self.remove_peer(peer)
        self._peers[peer] = _Peer(PeerStats(peer, addr), self.clock.monotonic())

    def remove_peer(self, peer: str) -> None:
        """Stop probing ``peer`` and forget its outstanding probes; unknown peers are ignored."""
        if self._peers.pop(peer, None) is None:
            return
        self._outstanding = {s: o for s, o in self._outstanding.items() if o.peer != peer}

    def stats(self, peer: str) -> PeerStats:
        """Return the snapshot for ``peer``; raises KeyError if it is not tracked."""
        return self._peers[peer].stats

    def snapshot(self) -> dict[str, PeerStats]:
        """Return the snapshots of every tracked peer."""
        return {name: p.stats for name, p in self._peers.items()}

    def poll(self) -> tuple[list[Probe], list[LinkEvent]]:
        """Expire overdue probes and return the probes now due plus any ``failed`` events."""
        now = self.clock.monotonic()
        events: list[LinkEvent] = []
        # Expire in send order, so misses are counted in the order the probes left.
        for seq in sorted(self._outstanding):
            out = self._outstanding[seq]
            if now - out.sent_at < self.timeout_s:
                continue
            del self._outstanding[seq]
            self._remember_expired(seq, out.peer)
            event = self._miss(out.peer)
            if event is not None:
                events.append(event)
        probes: list[Probe] = []
        for name, peer in self._peers.items():
            if peer.next_probe_at > now:
                continue
            seq = self._next_seq
            self._next_seq = (self._next_seq + 1) % (1 << 32) or 1
            self._outstanding[seq] = _Outstanding(name, now)
            peer.stats = replace(peer.stats, sent=peer.stats.sent + 1)
            peer.next_probe_at += self.interval_s
            if peer.next_probe_at <= now:
                # The caller fell behind: skip the missed slots rather than send a burst.
                peer.next_probe_at = now + self.interval_s
            probes.append(Probe(name, peer.stats.addr, seq))
        return probes, events

    def on_reply(self, seq: int) -> LinkEvent | None:
        """Record the reply to probe ``seq``; returns a ``recovered`` event if the link was down."""
        out = self._outstanding.pop(seq, None)
        if out is None:
            late_peer = self._expired.pop(seq, None)
            if late_peer is not None and late_peer in self._peers:
                p = self._peers[late_peer]
                p.stats = replace(p.stats, late=p.stats.late + 1)
            return None
        peer = self._peers.get(out.peer)
        if peer is None:
            return None
        now = self.clock.monotonic()
        rtt = max(0.0, now - out.sent_at)
        old = peer.stats
        ewma = (
            rtt
            if old.rtt_ewma_s is None
            else old.rtt_ewma_s + self.ewma_alpha * (rtt - old.rtt_ewma_s)
        )
        peer.recent.append((now, rtt))
        while peer.recent[0][0] < now - self.min_window_s:
            peer.recent.popleft()
        peer.stats = replace(
            old,
            state="up",
            rtt_ewma_s=ewma,
            rtt_last_s=rtt,
            rtt_min_s=min(r for _, r in peer.recent),
            received=old.received + 1,
            consecutive_misses=0,
            last_reply_at=now,
        )
        return LinkEvent("recovered", peer.stats) if old.state == "down" else None

    def next_deadline(self) -> float | None:
        """The earliest clock reading at which :meth:`poll` has something to do, or None."""
        times = [p.next_probe_at for p in self._peers.values()]
        times.extend(o.sent_at + self.timeout_s for o in self._outstanding.values())
        return min(times, default=None)

    def _miss(self, name: str) -> LinkEvent | None:
        peer = self._peers.get(name)
        if peer is None:
            return None
        old = peer.stats
        misses = old.consecutive_misses + 1
        failed = misses >= self.fail_after and old.state != "down"
        peer.stats = replace(
            old,
            lost=old.lost + 1,
            consecutive_misses=misses,
            state="down" if failed else old.state,
        )
        return LinkEvent("failed", peer.stats) if failed else None

    def _remember_expired(self, seq: int, peer: str) -> None:
        # Kept (bounded) so that a late reply is still credited to its peer as ``late``.
        self._expired[seq] = peer
        if len(self._expired) > _MAX_EXPIRED:
            del self._expired[next(iter(self._expired))]
