"""UDP echo RTT probing: a responder on every node, a prober per node for its neighbour links.

Wire format (20 bytes, network byte order)::

    magic "CHRT" | version u8 | kind u8 (1 ping, 2 pong) | reserved u16 | nonce u64 | seq u32

The responder echoes a valid ping as a pong of the same size (so it can never amplify traffic)
and drops everything else. The prober draws a random nonce when it starts and accepts only pongs
that carry it, so stray or forged datagrams, and replies meant for an earlier prober on the same
port, are counted as garbage and never crash or skew anything.

Failure detection (see :mod:`netprobe.linkstate`): a dead link is reported within
``interval_s * fail_after + timeout_s`` (4 s with the defaults) through ``on_fail``, and
``on_recover`` fires on the first reply after that.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import struct
from collections.abc import Callable
from dataclasses import dataclass
from types import TracebackType

from netprobe.clock import Clock, SystemClock
from netprobe.linkstate import LinkEvent, LinkTracker, PeerStats

log = logging.getLogger(__name__)

MAGIC = b"CHRT"
VERSION = 1
KIND_PING = 1
KIND_PONG = 2
_PACKET = struct.Struct("!4sBBHQI")
PACKET_SIZE = _PACKET.size

Address = tuple[str, int]
LinkCallback = Callable[[PeerStats], None]


@dataclass(frozen=True)
class RttPacket:
    """A decoded probe packet."""

    kind: int
    nonce: int
    seq: int

    def encode(self) -> bytes:
        """Serialise to the 20-byte wire format."""
        return _PACKET.pack(MAGIC, VERSION, self.kind, 0, self.nonce, self.seq)

    @classmethod
    def decode(cls, data: bytes) -> RttPacket | None:
        """Parse a datagram; returns None for anything that is not a valid probe packet."""
        if len(data) != PACKET_SIZE:
            return None
        magic, version, kind, _reserved, nonce, seq = _PACKET.unpack(data)
        if magic != MAGIC or version != VERSION or kind not in (KIND_PING, KIND_PONG):
            return None
        return cls(kind, nonce, seq)


class _Endpoint(asyncio.DatagramProtocol):
    """Forwards datagrams to a handler; an ICMP error on a send is not fatal to anything."""

    def __init__(self, handler: Callable[[bytes, Address], None]) -> None:
        self._handler = handler

    def datagram_received(self, data: bytes, addr: Address) -> None:
        self._handler(data, addr)

    def error_received(self, exc: Exception) -> None:
        # e.g. ECONNREFUSED from an ICMP port-unreachable: the probe just counts as missed.
        log.debug("rtt socket error: %s", exc)


async def _open_udp(
    host: str, port: int, handler: Callable[[bytes, Address], None]
) -> tuple[asyncio.DatagramTransport, int]:
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_datagram_endpoint(
        lambda: _Endpoint(handler), local_addr=(host, port)
    )
    return transport, transport.get_extra_info("sockname")[1]


class RttResponder:
    """Echoes RTT probes on ``host:port`` (``port=0`` picks a free port; read :attr:`port`).

    Args:
        host: Address to bind.
        port: UDP port to bind; 0 lets the kernel choose.

    Attributes:
        echoed: Pings answered.
        garbage: Datagrams dropped because they were not valid pings.
        drop: Fault-injection switch for tests; when True, valid pings are silently dropped.
    """

    def __init__(self, host: str = "0.0.0.0", port: int = 0) -> None:
        self.host = host
        self._requested_port = port
        self._transport: asyncio.DatagramTransport | None = None
        self._port: int | None = None
        self.echoed = 0
        self.garbage = 0
        self.drop = False

    @property
    def port(self) -> int:
        """The bound UDP port; raises RuntimeError before :meth:`start`."""
        if self._port is None:
            raise RuntimeError("RttResponder.port is only known after start()")
        return self._port

    async def start(self) -> None:
        """Bind the socket and start answering."""
        self._transport, self._port = await _open_udp(
            self.host, self._requested_port, self._on_datagram
        )

    async def stop(self) -> None:
        """Close the socket. Safe to call twice."""
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    async def __aenter__(self) -> RttResponder:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def _on_datagram(self, data: bytes, addr: Address) -> None:
        packet = RttPacket.decode(data)
        if packet is None or packet.kind != KIND_PING:
            self.garbage += 1
            return
        if self.drop or self._transport is None:
            return
        self._transport.sendto(RttPacket(KIND_PONG, packet.nonce, packet.seq).encode(), addr)
        self.echoed += 1


class RttProber:
    """Probes a changing set of peers over UDP and reports link failure and recovery.

    Callbacks run in the event loop and must not block; an exception in one is logged and
    swallowed, because a broken observer must not stop failure detection.

    Args:
        bind_host: Local address of the probing socket.
        bind_port: Local port (0: any).
        interval_s: Time between probes to one peer.
        timeout_s: Time after which an unanswered probe is missed (default: ``interval_s``).
        fail_after: Consecutive misses that declare a link failed.
        ewma_alpha: Weight of a new RTT sample in the smoothed RTT.
        on_fail: Called with the peer's stats when its link is declared failed.
        on_recover: Called with the peer's stats on the first reply after a failure.
        clock: Time source; inject a :class:`~netprobe.clock.FakeClock` in tests.
    """

    def __init__(
        self,
        *,
        bind_host: str = "0.0.0.0",
        bind_port: int = 0,
        interval_s: float = 1.0,
        timeout_s: float | None = None,
        fail_after: int = 3,
        ewma_alpha: float = 0.125,
        on_fail: LinkCallback | None = None,
        on_recover: LinkCallback | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._tracker = LinkTracker(
            interval_s=interval_s,
            timeout_s=interval_s if timeout_s is None else timeout_s,
            fail_after=fail_after,
            ewma_alpha=ewma_alpha,
            clock=clock or SystemClock(),
        )
        self._bind = (bind_host, bind_port)
        self.on_fail = on_fail
        self.on_recover = on_recover
        self._nonce = secrets.randbits(64)
        self._transport: asyncio.DatagramTransport | None = None
        self._task: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self.garbage = 0

    @property
    def detection_bound_s(self) -> float:
        """``interval_s * fail_after + timeout_s``: the worst-case failure detection time."""
        return self._tracker.detection_bound_s

    def add_peer(self, peer: str, host: str, port: int) -> None:
        """Start probing ``peer`` at ``host:port`` (a responder); takes effect at once."""
        self._tracker.add_peer(peer, (host, port))
        self._wake.set()

    def remove_peer(self, peer: str) -> None:
        """Stop probing ``peer``; no callback fires for it afterwards."""
        self._tracker.remove_peer(peer)

    def stats(self, peer: str) -> PeerStats:
        """The current snapshot for ``peer`` (KeyError if unknown)."""
        return self._tracker.stats(peer)

    def snapshot(self) -> dict[str, PeerStats]:
        """Snapshots of every peer."""
        return self._tracker.snapshot()

    async def start(self, *, run_loop: bool = True) -> None:
        """Bind the socket and, unless ``run_loop`` is False, start the probing task.

        With ``run_loop=False`` nothing is sent until the caller calls :meth:`poll`; tests use
        that with a manual clock.
        """
        self._transport, _ = await _open_udp(*self._bind, self._on_datagram)
        if run_loop:
            self._task = asyncio.create_task(self._run(), name="netprobe-rtt-prober")

    async def stop(self) -> None:
        """Stop probing and close the socket. Safe to call twice."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        if self._transport is not None:
            self._transport.close()
            self._transport = None

    async def __aenter__(self) -> RttProber:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    def poll(self) -> None:
        """Send the probes that are due and expire overdue ones (the loop calls this)."""
        probes, events = self._tracker.poll()
        if self._transport is not None:
            for probe in probes:
                packet = RttPacket(KIND_PING, self._nonce, probe.seq).encode()
                try:
                    self._transport.sendto(packet, probe.addr)
                except OSError as exc:  # e.g. no route while the link is cut: just a miss
                    log.debug("probe to %s failed to send: %s", probe.peer, exc)
        for event in events:
            self._dispatch(event)

    async def _run(self) -> None:
        clock = self._tracker.clock
        while True:
            self.poll()
            deadline = self._tracker.next_deadline()
            delay = 1.0 if deadline is None else max(0.0, deadline - clock.monotonic())
            self._wake.clear()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout=min(delay, 1.0))

    def _on_datagram(self, data: bytes, addr: Address) -> None:
        packet = RttPacket.decode(data)
        if packet is None or packet.kind != KIND_PONG or packet.nonce != self._nonce:
            self.garbage += 1
            return
        event = self._tracker.on_reply(packet.seq)
        if event is not None:
            self._dispatch(event)

    def _dispatch(self, event: LinkEvent) -> None:
        callback = self.on_fail if event.kind == "failed" else self.on_recover
        level = logging.WARNING if event.kind == "failed" else logging.INFO
        log.log(level, "link to %s %s", event.stats.peer, event.kind)
        if callback is None:
            return
        try:
            callback(event.stats)
        except Exception:
            log.exception("netprobe %s callback raised; ignored", event.kind)
