"""One authenticated connection: its socket, state, and the frame-reading loop.

``PeerLinks`` owns the connections; the reader here decodes headers, asks the handler of the
frame's kind where the payload goes, and reads it straight into that buffer. Any failure ends
the loop with a reason string; nothing escapes the reader thread.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from daemon.dataplane.errors import FrameError, PeerGone
from daemon.dataplane.frames import (
    HEADER_SIZE,
    FrameHeader,
    Kind,
    decode_header,
    discard_exact,
    recv_exact_into,
)

log = logging.getLogger("chaos.dataplane.links")


class FrameHandler(Protocol):
    """Consumer of the frames of some kinds (the all-reduce registers one)."""

    def buffer_for(
        self, peer: str, header: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        """Where the payload goes (exactly ``header.length`` bytes), or None to discard it.

        May block (e.g. to hold a frame of a round that has not started yet) while
        ``is_open()`` is true. Raises FrameError to close the link.
        """
        ...

    def on_frame(self, peer: str, header: FrameHeader, payload: memoryview) -> None:
        """The payload is now in the buffer returned by ``buffer_for``."""
        ...


@dataclass(frozen=True)
class LinkConfig:
    """Tuning knobs of PeerLinks.

    Attributes:
        sock_buf: SO_SNDBUF/SO_RCVBUF in bytes. The default 0 keeps kernel autotuning, which
            grows buffers up to net.ipv4.tcp_rmem/tcp_wmem (MiBs); a fixed size turns
            autotuning off and is capped by net.core.rmem_max, and measured slower here.
        handshake_timeout: Seconds a connection may take to authenticate.
        connect_timeout: Seconds to establish the TCP connection in ``connect_to``.
        io_poll: Kernel send/receive timeout; threads wake this often to check for shutdown.
        max_pending: Most unauthenticated connections handled at once; more are dropped.
    """

    sock_buf: int = 0
    handshake_timeout: float = 5.0
    connect_timeout: float = 5.0
    io_poll: float = 0.5
    max_pending: int = 16


class Link:
    """An authenticated connection to one peer."""

    def __init__(self, peer: str, sock: socket.socket, initiator: str, incarnation: str) -> None:
        self.peer, self.sock, self.initiator, self.incarnation = peer, sock, initiator, incarnation
        self.closed = threading.Event()
        self.send_lock = threading.Lock()

    def shutdown(self) -> None:
        # shutdown() (not close()) wakes a reader blocked in recv without freeing the fd under it.
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)

    def read_loop(self, handlers: Mapping[Kind, FrameHandler]) -> str:
        """Serve frames until the connection ends; returns why it ended (never raises)."""
        head = memoryview(bytearray(HEADER_SIZE))
        try:
            while not self.closed.is_set():
                recv_exact_into(self.sock, head, self.peer)
                header = decode_header(head)
                if header.kind in (Kind.HELLO, Kind.PROOF):
                    raise FrameError(f"unexpected {header.kind.name} frame after the handshake")
                handler = handlers.get(header.kind)
                dest = None
                if handler is not None:
                    dest = handler.buffer_for(self.peer, header, self.is_open)
                if dest is None or handler is None:
                    discard_exact(self.sock, header.length, self.peer)
                    continue
                if len(dest) != header.length:
                    raise FrameError("handler buffer does not match the payload length")
                recv_exact_into(self.sock, dest, self.peer)
                handler.on_frame(self.peer, header, dest)
        except FrameError as exc:
            log.warning("closing link to %s: malformed frame: %s", self.peer, exc)
            return f"malformed frame: {exc}"
        except PeerGone as exc:
            return exc.reason
        except OSError as exc:
            return f"socket error: {exc}"
        except Exception as exc:  # a reader thread must never die silently
            log.exception("reader of link to %s failed", self.peer)
            return f"internal error: {exc!r}"
        return "closed locally"

    def is_open(self) -> bool:
        """Whether the connection has not been shut down."""
        return not self.closed.is_set()
