"""Wire format of state replication, its limits, its errors, and dialling a state server.

A connection starts with the data plane's mutual HMAC handshake
(:mod:`chaos_edge.dataplane.auth`), then carries frames of a fixed 36-byte big-endian header plus
``payload`` bytes::

    magic   4s  b"CHRS"
    format  B   FORMAT_VERSION
    kind    B   Kind
    flags   H   reserved, 0
    version Q   state version (training step) the frame is about; ANY_VERSION in GET_MANIFEST
    offset  Q   byte offset in the state (GET, GET_VIA, DATA); an error code in ERROR
    length  Q   requested bytes (GET, GET_VIA); bytes carried (DATA)
    payload I   bytes following the header; capped per kind by MAX_PAYLOAD

The data-plane frame kinds are a closed enum owned by the all-reduce, so replication has its own
small header rather than new kinds there. Every kind has a hard payload cap, so a peer can never
make the other side allocate or read more than ``MAX_PAYLOAD[kind]`` per frame.
"""

from __future__ import annotations

import enum
import json
import select
import socket
import struct
from collections.abc import Sequence
from dataclasses import dataclass

from chaos_edge.dataplane import auth
from chaos_edge.dataplane.errors import DataPlaneError, PeerGone
from chaos_edge.replication.errors import ReplicationError
from chaos_edge.replication.manifest import Manifest

MAGIC = b"CHRS"
FORMAT_VERSION = 1
HEADER = struct.Struct("!4sBBHQQQI")
HEADER_SIZE = HEADER.size
ANY_VERSION = (1 << 64) - 1
#: Bytes per DATA frame; the receiver reads each straight into its final place.
CHUNK_BYTES = 4 << 20
#: Most bytes a batched receive waits for before the kernel wakes it (see :func:`recv_into`).
LOWAT_BYTES = 4 << 20
MAX_ROUTE_HOPS = 16


class Kind(enum.IntEnum):
    """Frame kinds: requests from the fetcher, answers from the server."""

    GET_MANIFEST = 1  # -> MANIFEST or ERROR
    MANIFEST = 2  # payload: the manifest JSON
    GET = 3  # -> DATA frames covering [offset, offset + length), in order, or ERROR
    GET_VIA = 4  # as GET, payload: JSON list of the hops still to go (relay)
    DATA = 5  # payload: state bytes at offset
    ERROR = 6  # offset: ErrorCode, payload: UTF-8 message


class ErrorCode(enum.IntEnum):
    """Why a server refused a request."""

    VERSION = 1  # it serves another state version
    RANGE = 2  # the range lies outside the state
    RELAY = 3  # an upstream hop of a relayed request failed
    REQUEST = 4  # malformed request


MAX_PAYLOAD = {
    Kind.GET_MANIFEST: 0,
    Kind.MANIFEST: 64 << 20,  # 1 MiB blocks: a 3 GiB state's manifest is ~0.2 MiB
    Kind.GET: 0,
    Kind.GET_VIA: 2048,
    Kind.DATA: 4 << 20,
    Kind.ERROR: 4096,
}


class TransferError(ReplicationError):
    """A state transfer failed; the message says which neighbour and why."""


class ProtocolError(TransferError):
    """A peer sent a frame that breaks the protocol (the connection is dropped)."""


class RefusedError(TransferError):
    """A server refused a request.

    Attributes:
        code: The server's :class:`ErrorCode`.
    """

    def __init__(self, message: str, code: ErrorCode) -> None:
        super().__init__(message)
        self.code = code


class VersionMismatchError(RefusedError):
    """The server serves another state version than the one requested."""


@dataclass(frozen=True, slots=True)
class Header:
    """A decoded frame header (see the module docstring)."""

    kind: Kind
    version: int
    offset: int
    length: int
    payload: int


def encode(kind: Kind, version: int, offset: int = 0, length: int = 0, payload: int = 0) -> bytes:
    """Pack a header; the caller sends ``payload`` bytes after it."""
    if payload > MAX_PAYLOAD[kind]:
        raise ProtocolError(f"{kind.name} payload of {payload} bytes is over the limit")
    return HEADER.pack(MAGIC, FORMAT_VERSION, int(kind), 0, version, offset, length, payload)


def decode(data: bytes | bytearray | memoryview) -> Header:
    """Parse and check a header.

    Raises:
        ProtocolError: Bad magic, format or kind, or a payload over the kind's cap.
    """
    magic, fmt, kind, _, version, offset, length, payload = HEADER.unpack(data)
    if magic != MAGIC or fmt != FORMAT_VERSION:
        raise ProtocolError(f"not a state-replication frame (magic {bytes(magic)!r}, fmt {fmt})")
    try:
        k = Kind(kind)
    except ValueError:
        raise ProtocolError(f"unknown frame kind {kind}") from None
    if payload > MAX_PAYLOAD[k]:
        raise ProtocolError(f"{k.name} payload of {payload} bytes is over the limit")
    return Header(k, version, offset, length, payload)


def kernel_timeouts(sock: socket.socket, seconds: float) -> None:
    """Make ``sock`` blocking, with the kernel timing out a silent receive or a stuck send.

    A Python-level timeout (``settimeout``) makes the socket non-blocking underneath, so every
    receive is a ``poll`` plus a ``recv`` that returns whatever has arrived; a blocking
    ``MSG_WAITALL`` receive of a whole chunk is one system call, which matters when one CPU
    receives several links at once. Read such a socket with :func:`recv_into`.
    """
    sock.settimeout(None)
    sec = int(seconds)
    tv = struct.pack("ll", sec, int((seconds - sec) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def recv_into(sock: socket.socket, view: memoryview, peer: str, *, batch: bool = False) -> None:
    """Fill ``view`` from ``sock`` (blocking or with a Python timeout).

    With ``batch``, the receiver sleeps until a whole piece of ``view`` (up to ``LOWAT_BYTES``)
    is queued and then takes it in one call, rather than waking for every segment: a tenth of
    the receiver's system time when several links arrive at once. It waits in ``poll`` with
    ``SO_RCVLOWAT`` set to the bytes still wanted (set back to 1 afterwards). Not in a
    ``MSG_WAITALL`` receive: that one copies what is queued and then sleeps, and the kernel
    wakes it only once ``SO_RCVLOWAT`` *further* bytes are queued, which never happens when
    the frame's last bytes are fewer than that and the sender has nothing more to send.

    Raises:
        PeerGone: The peer closed the connection first.
        TimeoutError: Nothing arrived within the socket's timeout (Python or kernel).
        OSError: The socket failed.
    """
    view = view.cast("B")
    got, total = 0, len(view)
    wait_ms = _receive_timeout_ms(sock) if batch else -1
    try:
        while got < total:
            if batch:
                want = min(total - got, LOWAT_BYTES)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, want)
                poller = select.poll()
                poller.register(sock, select.POLLIN)
                if not poller.poll(wait_ms):
                    raise TimeoutError(f"{peer} sent nothing within the receive timeout")
                # Usually ``want`` bytes are queued now, but the kernel also reports fewer as
                # readable (memory pressure, a closing window): take what is there, never wait
                # in the receive itself (it would wait as MSG_WAITALL does, see above).
                try:
                    n = sock.recv_into(view[got:], total - got, socket.MSG_DONTWAIT)
                except BlockingIOError:
                    continue
            else:
                try:
                    n = sock.recv_into(view[got:], total - got, socket.MSG_WAITALL)
                except BlockingIOError:  # SO_RCVTIMEO expired with nothing read
                    raise TimeoutError(f"{peer} sent nothing within the receive timeout") from None
            if n == 0:
                raise PeerGone(peer, "connection closed by peer")
            got += n
    finally:
        if batch:  # a header or a short last chunk must not wait for bytes that never come
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVLOWAT, 1)


def _receive_timeout_ms(sock: socket.socket) -> int:
    """The socket's receive timeout in ms for ``poll`` (-1: none): Python's, else the kernel's."""
    timeout = sock.gettimeout()
    if timeout is not None:
        return max(1, int(timeout * 1000))
    sec, usec = struct.unpack("ll", sock.getsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, 16))
    ms = sec * 1000 + usec // 1000
    return ms if ms > 0 else -1


def read_header(sock: socket.socket, peer: str) -> Header:
    """Read and decode one header (raises ``PeerGone`` on EOF, ``OSError`` on failure)."""
    head = bytearray(HEADER_SIZE)
    recv_into(sock, memoryview(head), peer)
    return decode(head)


def read_payload(sock: socket.socket, header: Header, peer: str) -> bytes:
    """Read a small payload (its size is already capped by :func:`decode`)."""
    buf = bytearray(header.payload)
    if header.payload:
        recv_into(sock, memoryview(buf), peer)
    return bytes(buf)


def error_frame(code: ErrorCode, version: int, message: str) -> bytes:
    """An ERROR frame, header and payload."""
    body = message.encode()[: MAX_PAYLOAD[Kind.ERROR]]
    return encode(Kind.ERROR, version, int(code), 0, len(body)) + body


def raise_error(header: Header, body: bytes, peer: str) -> None:
    """Turn a received ERROR frame into the matching exception."""
    try:
        code = ErrorCode(header.offset)
    except ValueError:
        code = ErrorCode.REQUEST
    message = f"{peer} refused: {body.decode(errors='replace')}"
    if code is ErrorCode.VERSION:
        raise VersionMismatchError(message, code)
    raise RefusedError(message, code)


def route_payload(hops: Sequence[str]) -> bytes:
    """The GET_VIA payload naming the hops still to go."""
    if len(hops) > MAX_ROUTE_HOPS:
        raise ProtocolError(f"a route may have at most {MAX_ROUTE_HOPS} hops")
    return json.dumps(list(hops)).encode()


def parse_route(body: bytes) -> list[str]:
    """Inverse of :func:`route_payload`; raises :class:`ProtocolError` on bad input."""
    try:
        hops = json.loads(body)
    except ValueError:
        raise ProtocolError("route is not JSON") from None
    if (
        not isinstance(hops, list)
        or not 0 < len(hops) <= MAX_ROUTE_HOPS
        or not all(isinstance(h, str) and auth.valid_node_id(h) for h in hops)
    ):
        raise ProtocolError("route must be a non-empty list of node ids")
    return hops


def dial(
    address: tuple[str, int],
    me: auth.Identity,
    peer: str,
    *,
    connect_timeout: float = 5.0,
    io_timeout: float = 30.0,
) -> socket.socket:
    """Open and authenticate a connection to the state server of ``peer``.

    Args:
        address: The server's (host, port).
        me: This node's credentials.
        peer: The node id the server must prove to be.
        connect_timeout: Seconds for TCP connect and for the handshake.
        io_timeout: Afterwards, a read or write that stalls this long raises ``TimeoutError``.

    Raises:
        TransferError: Connection refused, or the handshake failed (wrong secret, refused).
    """
    try:
        sock = socket.create_connection(address, timeout=connect_timeout)
    except OSError as exc:
        raise TransferError(
            f"cannot connect to {peer} at {address[0]}:{address[1]}: {exc}"
        ) from None
    try:
        auth.initiate(sock, me, peer, connect_timeout)
    except DataPlaneError as exc:
        sock.close()
        raise TransferError(f"handshake with {peer} failed: {exc}") from None
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.settimeout(io_timeout)
    return sock


def fetch_manifest(
    address: tuple[str, int],
    me: auth.Identity,
    peer: str,
    version: int = ANY_VERSION,
    timeout: float = 10.0,
) -> Manifest:
    """Ask ``peer``'s state server for its manifest (of ``version``, or whatever it serves).

    Raises:
        VersionMismatchError: It serves another version.
        TransferError: It cannot be reached, refuses us, or answers garbage.
    """
    sock = dial(address, me, peer, connect_timeout=timeout, io_timeout=timeout)
    try:
        sock.sendall(encode(Kind.GET_MANIFEST, version))
        h = read_header(sock, peer)
        body = read_payload(sock, h, peer)
        if h.kind is Kind.ERROR:
            raise_error(h, body, peer)
        if h.kind is not Kind.MANIFEST:
            raise ProtocolError(f"{peer} answered GET_MANIFEST with {h.kind.name}")
        return Manifest.from_json(body)
    except (OSError, DataPlaneError) as exc:
        raise TransferError(f"cannot get the manifest from {peer}: {exc}") from None
    finally:
        sock.close()
