"""The neighbour side: serve byte ranges of an immutable state snapshot to authenticated peers.

Memory: the server never copies the snapshot. It holds one read-only ``memoryview`` of it and
hands slices of that view to ``socket.send``, which the kernel copies into the socket buffer
(kernel memory, bounded by ``SO_SNDBUF``). Per connection it adds one thread and a 36-byte
header; a connection that relays (``GET_VIA``) adds one ``chunk_bytes`` buffer and one upstream
socket. Its extra memory is therefore bounded by::

    len(manifest JSON) + max_connections * (thread stack in use + chunk_bytes)

(about 1 MiB + 32 * 4.1 MiB with the defaults, whatever the state's size). The bench measures
the anonymous RSS a serving process adds and reports it next to this bound.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from chaos_edge.dataplane import auth
from chaos_edge.dataplane.errors import AuthError, DataPlaneError, PeerGone
from chaos_edge.dataplane.frames import recv_exact_into
from chaos_edge.replication.transfer import wire
from chaos_edge.replication.transfer.snapshot import Buffer, Snapshot
from chaos_edge.replication.transfer.throttle import TokenBucket
from chaos_edge.replication.transfer.wire import ErrorCode, Kind, TransferError

log = logging.getLogger("chaos.replication.serve")
PACE_BYTES = 64 << 10  # a paced sender writes this much per token-bucket step
#: Test seam: may replace the bytes of a chunk before it is sent (fault injection).
Mangle = Callable[[str, int, memoryview], Buffer]


@dataclass
class ServerStats:
    """Counters of one server (read them with :meth:`StateServer.stats`)."""

    connections: int = 0
    refused: int = 0
    requests: int = 0
    errors_sent: int = 0
    bytes_sent: int = 0
    bytes_relayed: int = 0
    by_peer: dict[str, int] = field(default_factory=dict)


class _UpstreamFailed(Exception):
    """The next hop of a relayed request failed (reported downstream as ErrorCode.RELAY)."""


class StateServer:
    """Serves one snapshot over TCP; one thread per authenticated connection.

    Args:
        snapshot: The state to serve.
        me: This node's credentials (the cluster secret authenticates every peer).
        is_allowed: Called with each authenticated peer's id; False refuses it.
        host: Address to listen on.
        port: Port (0 picks a free one; see :attr:`address`).
        rate: Bytes/s cap of the link to a peer (``rate(peer_id)``; None = uncapped). All of a
            peer's connections share its bucket, as they share the physical link.
        peers: Node id -> address of the state servers this one may relay from.
        max_connections: Connections served at once; more are closed at accept.
        chunk_bytes: Bytes per DATA frame (and size of a relay buffer).
        io_timeout: A send, or a wait for the next request, that stalls this long ends the
            connection.
        mangle: Fault-injection seam for tests; see :data:`Mangle`.
    """

    def __init__(
        self,
        snapshot: Snapshot,
        me: auth.Identity,
        *,
        is_allowed: Callable[[str], bool] = lambda _peer: True,
        host: str = "127.0.0.1",
        port: int = 0,
        rate: Callable[[str], float | None] | None = None,
        peers: Mapping[str, tuple[str, int]] | None = None,
        max_connections: int = 32,
        chunk_bytes: int = wire.CHUNK_BYTES,
        io_timeout: float = 30.0,
        mangle: Mangle | None = None,
    ) -> None:
        if not 0 < chunk_bytes <= wire.MAX_PAYLOAD[Kind.DATA]:
            raise ValueError(f"chunk_bytes must be in (0, {wire.MAX_PAYLOAD[Kind.DATA]}]")
        self.snapshot, self.me = snapshot, me
        self._manifest_json = snapshot.manifest.to_json().encode()
        self._is_allowed, self._rate, self._mangle = is_allowed, rate, mangle
        self.peers: dict[str, tuple[str, int]] = dict(peers or {})
        self._bind, self.chunk_bytes, self.io_timeout = (host, port), chunk_bytes, io_timeout
        self._slots = threading.BoundedSemaphore(max_connections)
        self._lock = threading.Lock()
        self._stats = ServerStats()
        self._buckets: dict[str, TokenBucket | None] = {}
        self._socks: set[socket.socket] = set()
        self._threads: set[threading.Thread] = set()
        self._closing = threading.Event()
        self._listener: socket.socket | None = None

    # -- lifecycle -------------------------------------------------------------------------
    def start(self) -> tuple[str, int]:
        """Listen and start accepting; returns :attr:`address`."""
        lsock = socket.create_server(self._bind, backlog=64)
        lsock.settimeout(0.2)  # the accept loop wakes up this often to see close()
        self._listener = lsock
        self._spawn(self._accept_loop, "state-accept")
        return self.address

    @property
    def address(self) -> tuple[str, int]:
        """The listening (host, port)."""
        if self._listener is None:
            raise TransferError("StateServer.start() has not been called")
        host, port = self._listener.getsockname()[:2]
        return str(host), int(port)

    def close(self, timeout: float = 2.0) -> None:
        """Stop accepting, cut every connection, and join the threads (bounded)."""
        self._closing.set()
        if self._listener is not None:
            self._listener.close()
        with self._lock:
            socks = list(self._socks)
        for s in socks:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv/send
        for t in list(self._threads):
            if t is not threading.current_thread():
                t.join(timeout)

    def __enter__(self) -> StateServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def stats(self) -> ServerStats:
        """A copy of the counters."""
        with self._lock:
            return ServerStats(**{**vars(self._stats), "by_peer": dict(self._stats.by_peer)})

    # -- internals -------------------------------------------------------------------------
    def _spawn(self, target: Callable[..., None], name: str, *args: object) -> None:
        t = threading.Thread(target=self._run, args=(target, args), name=name)
        t.daemon = True  # never keeps the process alive; close() joins them
        with self._lock:
            self._threads.add(t)
        t.start()

    def _run(self, target: Callable[..., None], args: tuple[object, ...]) -> None:
        try:
            target(*args)
        except Exception:  # a server thread must never die silently
            log.exception("state server thread failed")
        finally:
            with self._lock:
                self._threads.discard(threading.current_thread())

    def _count(self, **inc: int) -> None:
        with self._lock:
            for key, value in inc.items():
                setattr(self._stats, key, getattr(self._stats, key) + value)

    def _bucket(self, peer: str) -> TokenBucket | None:
        with self._lock:
            if peer not in self._buckets:
                bps = self._rate(peer) if self._rate else None
                self._buckets[peer] = TokenBucket(bps) if bps else None
            return self._buckets[peer]

    def _accept_loop(self) -> None:
        assert self._listener is not None
        while not self._closing.is_set():
            try:
                sock, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # listener closed
            if not self._slots.acquire(blocking=False):
                log.warning("state server full; dropping a connection")
                sock.close()
                continue
            with self._lock:
                self._socks.add(sock)
            self._spawn(self._connection, "state-conn", sock)

    def _connection(self, sock: socket.socket) -> None:
        upstream: dict[str, socket.socket] = {}
        try:
            try:
                hello = auth.accept(sock, self.me, self._is_allowed, self.io_timeout)
            except AuthError as exc:
                log.warning("refused a state-transfer connection: %s", exc)
                self._count(refused=1)
                return
            self._count(connections=1)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.settimeout(self.io_timeout)
            self._serve(sock, hello.node_id, upstream)
        except (DataPlaneError, TransferError, OSError) as exc:
            log.info("state-transfer connection ended: %s", exc)
        finally:
            for up in upstream.values():
                up.close()
            with self._lock:
                self._socks.discard(sock)
            sock.close()
            self._slots.release()

    def _serve(self, sock: socket.socket, peer: str, upstream: dict[str, socket.socket]) -> None:
        version = self.snapshot.manifest.version
        total = self.snapshot.manifest.total_bytes
        relay_buf: bytearray | None = None
        while not self._closing.is_set():
            try:
                h = wire.read_header(sock, peer)
            except PeerGone:
                return  # the fetcher is done with us
            body = wire.read_payload(sock, h, peer)
            self._count(requests=1)
            if h.kind not in (Kind.GET_MANIFEST, Kind.GET, Kind.GET_VIA):
                raise wire.ProtocolError(f"{peer} sent a {h.kind.name} frame as a request")
            if h.version != version and not (
                h.kind is Kind.GET_MANIFEST and h.version == wire.ANY_VERSION
            ):
                msg = f"state version {h.version} requested, this node serves {version}"
                self._refuse(sock, ErrorCode.VERSION, h.version, msg)
            elif h.kind is Kind.GET_MANIFEST:
                sock.sendall(wire.encode(Kind.MANIFEST, version, 0, 0, len(self._manifest_json)))
                sock.sendall(self._manifest_json)
            elif h.offset + h.length > total or h.length == 0:
                msg = f"range ({h.offset}, {h.length}) is not inside the {total}-byte state"
                self._refuse(sock, ErrorCode.RANGE, version, msg)
            elif h.kind is Kind.GET:
                self._send_range(sock, peer, version, h.offset, h.length)
            else:
                relay_buf = relay_buf or bytearray(self.chunk_bytes)
                self._relay(sock, peer, h, wire.parse_route(body), upstream, relay_buf)

    def _refuse(self, sock: socket.socket, code: ErrorCode, version: int, msg: str) -> None:
        self._count(errors_sent=1)
        sock.sendall(wire.error_frame(code, version, msg))

    def _send_chunk(
        self, sock: socket.socket, peer: str, version: int, offset: int, data: Buffer
    ) -> None:
        view = memoryview(data)
        sock.sendall(wire.encode(Kind.DATA, version, offset, len(view), len(view)))
        bucket = self._bucket(peer)
        if bucket is None:
            sock.sendall(view)
        else:
            for i in range(0, len(view), PACE_BYTES):
                piece = view[i : i + PACE_BYTES]
                bucket.consume(len(piece))
                sock.sendall(piece)
        with self._lock:
            self._stats.by_peer[peer] = self._stats.by_peer.get(peer, 0) + len(view)

    def _send_range(
        self, sock: socket.socket, peer: str, version: int, off: int, length: int
    ) -> None:
        end = off + length
        for start in range(off, end, self.chunk_bytes):
            view = self.snapshot.data[start : min(end, start + self.chunk_bytes)]
            data = self._mangle(peer, start, view) if self._mangle else view
            self._send_chunk(sock, peer, version, start, data)
            self._count(bytes_sent=len(view))

    def _relay(
        self,
        sock: socket.socket,
        peer: str,
        h: wire.Header,
        hops: list[str],
        upstream: dict[str, socket.socket],
        buf: bytearray,
    ) -> None:
        """Fetch a range from the next hop and forward it chunk by chunk (store and forward)."""
        nxt, rest = hops[0], hops[1:]
        expected, end = h.offset, h.offset + h.length
        try:
            up = upstream.get(nxt) or self._dial(nxt)
            upstream[nxt] = up
            if rest:
                route = wire.route_payload(rest)
                up.sendall(wire.encode(Kind.GET_VIA, h.version, h.offset, h.length, len(route)))
                up.sendall(route)
            else:
                up.sendall(wire.encode(Kind.GET, h.version, h.offset, h.length))
        except (OSError, TransferError) as exc:
            upstream.pop(nxt, None)
            self._refuse(sock, ErrorCode.RELAY, h.version, f"relay to {nxt} failed: {exc}")
            return
        while expected < end:
            try:
                uh = wire.read_header(up, nxt)
                if uh.kind is Kind.ERROR:
                    body = wire.read_payload(up, uh, nxt)
                    self._count(errors_sent=1)
                    sock.sendall(wire.encode(Kind.ERROR, uh.version, uh.offset, 0, len(body)))
                    sock.sendall(body)
                    return
                n = uh.payload
                if (
                    uh.kind is not Kind.DATA
                    or uh.offset != expected
                    or uh.length != n
                    or not 0 < n <= len(buf)
                    or expected + n > end
                ):
                    raise _UpstreamFailed(f"{nxt} broke the protocol")
                recv_exact_into(up, memoryview(buf)[:n], nxt)
            except (OSError, DataPlaneError, TransferError, _UpstreamFailed) as exc:
                upstream.pop(nxt, None)
                up.close()
                self._refuse(sock, ErrorCode.RELAY, h.version, f"relay from {nxt} failed: {exc}")
                return
            self._send_chunk(sock, peer, h.version, expected, memoryview(buf)[:n])
            self._count(bytes_relayed=n)
            expected += n

    def _dial(self, peer: str) -> socket.socket:
        if peer not in self.peers:
            raise TransferError(f"no address known for relay hop {peer!r}")
        return wire.dial(self.peers[peer], self.me, peer, io_timeout=self.io_timeout)


def serve(snapshot: Snapshot, me: auth.Identity, **options: object) -> StateServer:
    """Start serving ``snapshot``; returns the running server (``close()`` it when done).

    Args:
        snapshot: The state captured at the step boundary.
        me: This node's credentials.
        **options: Keyword options of :class:`StateServer`.
    """
    server = StateServer(snapshot, me, **options)  # type: ignore[arg-type]
    server.start()
    return server
