"""One authenticated connection: its socket, state, and its frame reader and writer loops.

``PeerLinks`` owns the connections; the reader here decodes headers, asks the handler of the
frame's kind where the payload goes, and reads it straight into that buffer. The writer sends
the frames queued on the link, in order, each header and payload in one system call, so the
thread that queues a chunk (the all-reduce's round thread, or a reader forwarding a broadcast
chunk) goes on reducing or reading while the kernel copies it out, and a slow link never
holds up the others. Any failure ends a loop with a reason string; nothing escapes either
thread.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import threading
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple, Protocol

from chaos_edge.dataplane.errors import FrameError, PeerGone
from chaos_edge.dataplane.frames import (
    HEADER_SIZE,
    FrameHeader,
    Kind,
    decode_header,
    discard_exact,
    recv_exact_into,
)
from chaos_edge.dataplane.sockets import send_frame

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


#: ``done(sent)`` of a queued frame: called on the writer thread once the frame is written
#: (``True``) or dropped (``False``: cancelled, or the link went down first).
Done = Callable[[bool], None]


class Outgoing(NamedTuple):
    """A frame queued on a link: the header's wire bytes, the payload, and its bookkeeping."""

    head: bytes
    payload: bytes | memoryview
    deadline: float | None
    live: Callable[[], bool] | None  # checked just before writing; False drops the frame
    done: Done | None


class Link:
    """An authenticated connection to one peer."""

    def __init__(self, peer: str, sock: socket.socket, initiator: str, incarnation: str) -> None:
        self.peer, self.sock, self.initiator, self.incarnation = peer, sock, initiator, incarnation
        self.closed = threading.Event()
        self._outq: deque[Outgoing] = deque()
        self._qlock = threading.Lock()  # taken directly: cheaper than the Condition's enter
        self._qcond = threading.Condition(self._qlock)
        self._dead = False  # the writer has stopped: nothing more is queued
        self._writing = False  # a thread is writing a frame (the writer, or a poster)
        # Bytes written and read (headers included), for the benches. Written by one thread
        # at a time each: the one holding ``_writing``, and the reader.
        self.sent_bytes = 0
        self.received_bytes = 0

    def shutdown(self) -> None:
        # shutdown() (not close()) wakes a reader blocked in recv without freeing the fd under it.
        self.closed.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        with self._qlock:
            self._qcond.notify_all()

    def post(self, item: Outgoing) -> bool:
        """Queue a frame; False if the link is closed (nothing queued).

        With nothing queued and the writer idle, the calling thread first writes what the
        socket takes without blocking: the bytes are then copied while they are still in
        this core's cache, and the writer thread is woken only for what is left.
        """
        with self._qlock:
            if self._dead or self.closed.is_set():
                return False
            if self._outq or self._writing:
                self._outq.append(item)
                if len(self._outq) == 1 and not self._writing:
                    self._qcond.notify()
                return True
            self._writing = True
        rest: Outgoing | None = item
        try:
            rest = self._try_write(item)
        finally:
            with self._qlock:
                self._writing = False
                if rest is not None:
                    self._outq.appendleft(rest)
                if self._outq:
                    self._qcond.notify()
        if rest is None and item.done is not None:
            item.done(True)
        return True

    def _try_write(self, item: Outgoing) -> Outgoing | None:
        """Write what the socket takes now; the unsent rest (None if all went, the item
        itself if nothing did). A partly written frame must be finished: its rest is live."""
        if item.live is not None and not item.live():
            return item  # the writer drops it, and says so
        body = memoryview(item.payload).cast("B")
        try:
            sent = self.sock.sendmsg([item.head, body], [], socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return item
        except OSError:
            return item  # the writer fails on it too, and closes the link
        self.sent_bytes += sent
        head = len(item.head)
        if sent == head + len(body):
            return None
        if sent < head:
            return item._replace(head=item.head[sent:], live=None)
        return item._replace(head=b"", payload=body[sent - head:], live=None)

    def write_loop(self, io_poll: float) -> str:
        """Write queued frames in order until the link closes or a send fails; returns why
        it ended (never raises). The owner then drops the link and calls :meth:`drain`."""
        try:
            while True:
                with self._qlock:
                    while (not self._outq or self._writing) and not self.closed.is_set():
                        self._qcond.wait(io_poll)
                    if self.closed.is_set():
                        return "closed locally"
                    item = self._outq.popleft()
                    self._writing = True
                try:
                    if item.live is not None and not item.live():
                        if item.done is not None:
                            item.done(False)
                        continue
                    send_frame(self.sock, item.head, item.payload, item.deadline, self.peer)
                    self.sent_bytes += len(item.head) + memoryview(item.payload).nbytes
                finally:
                    with self._qlock:
                        self._writing = False
                if item.done is not None:
                    item.done(True)
        except PeerGone as exc:
            return exc.reason
        except Exception as exc:  # a writer thread must never die silently
            log.exception("writer of link to %s failed", self.peer)
            return f"internal error: {exc!r}"

    def drain(self) -> None:
        """Refuse further frames and drop the queued ones (``done(False)``)."""
        with self._qlock:
            self._dead = True
            left, self._outq = list(self._outq), deque()
        for item in left:
            if item.done is not None:
                try:
                    item.done(False)
                except Exception:
                    log.exception("dropped frame's callback failed")

    def read_loop(self, handlers: Mapping[Kind, FrameHandler]) -> str:
        """Serve frames until the connection ends; returns why it ended (never raises)."""
        head = memoryview(bytearray(HEADER_SIZE))
        try:
            while not self.closed.is_set():
                recv_exact_into(self.sock, head, self.peer)
                header = decode_header(head)
                self.received_bytes += HEADER_SIZE + header.length
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
