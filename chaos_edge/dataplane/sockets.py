"""Socket tuning and deadline-bounded sends shared by the data plane."""

from __future__ import annotations

import socket
import struct
import time

from chaos_edge.dataplane.errors import PeerGone


def set_buffers(sock: socket.socket, size: int) -> None:
    """Ask for ``size``-byte kernel send/receive buffers (0 keeps kernel autotuning).

    Must run before connect()/listen() so TCP can negotiate a large enough window scale.
    """
    if size > 0:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, size)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, size)


def tune_established(sock: socket.socket, io_poll: float) -> None:
    """Configure an authenticated connection for bulk transfer.

    The socket goes back to blocking mode, so ``recv_into(..., MSG_WAITALL)`` returns a whole
    chunk in one call, with kernel send/receive timeouts of ``io_poll`` seconds so no thread
    ever blocks without waking up to check deadlines and shutdown.
    """
    sock.settimeout(None)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sec = int(io_poll)
    tv = struct.pack("ll", sec, int((io_poll - sec) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)
    # Keepalive finds half-open connections (a box that lost power) within about 20 s.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 3), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def send_all(
    sock: socket.socket, data: bytes | memoryview, deadline: float | None, peer: str
) -> None:
    """Send every byte of ``data`` before ``deadline`` (a ``time.monotonic()`` value).

    A stalled peer (e.g. SIGSTOPped) makes the kernel send timeout fire repeatedly; once the
    deadline passes we give up. A partial frame then sits on the wire, so the caller must
    close the connection.

    Raises:
        PeerGone: The deadline passed or the socket failed.
    """
    view = memoryview(data).cast("B")
    sent = 0
    while sent < len(view):
        try:
            sent += sock.send(view[sent:])
        except BlockingIOError:
            pass  # SO_SNDTIMEO expired: the peer is not reading; check the deadline
        except OSError as exc:
            raise PeerGone(peer, f"send failed: {exc}") from None
        if sent < len(view) and deadline is not None and time.monotonic() >= deadline:
            raise PeerGone(peer, "send stalled past the deadline")


def send_frame(
    sock: socket.socket, head: bytes, payload: bytes | memoryview, deadline: float | None,
    peer: str,
) -> None:  # fmt: skip
    """Send a frame's header and payload, in one system call when the socket takes it all.

    One ``sendmsg`` instead of two sends halves the system calls per chunk, and the header
    never travels in a segment of its own that wakes the reader for 40 bytes.

    Raises:
        PeerGone: As :func:`send_all`.
    """
    body = memoryview(payload).cast("B")
    if not len(body):
        send_all(sock, head, deadline, peer)
        return
    try:
        sent = sock.sendmsg([head, body])
    except BlockingIOError:
        sent = 0  # SO_SNDTIMEO expired before anything went out
    except OSError as exc:
        raise PeerGone(peer, f"send failed: {exc}") from None
    if sent < len(head):
        send_all(sock, head[sent:], deadline, peer)
        sent = len(head)
    send_all(sock, body[sent - len(head):], deadline, peer)
