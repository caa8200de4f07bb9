"""The ``plain`` baseline of ``chaosctl bench scaleout``: plain sockets, a proportional split.

What a user gets with the standard library and no protocol: each neighbour runs a bare TCP
server on its state; the new node opens one connection per neighbour, asks for one byte range
(16 bytes: offset, length) and reads the answer straight into its buffer. The ranges are the
water-filling split of the whole state as one segment (proportional to the planning rates), so
its time is what the measured rates allow through Python sockets on this box. No
authentication, no checksums, no rebalancing, no healing: the bytes are verified afterwards,
outside the timed part.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass

from chaos_edge.dataplane.frames import recv_exact_into
from chaos_edge.replication.transfer.snapshot import Buffer
from chaos_edge.replication.transfer.wire import kernel_timeouts, recv_into

REQUEST = struct.Struct("!QQ")  # offset, length
RECV_BYTES = 1 << 20


class PlainServer:
    """Serves byte ranges of ``data`` to anyone, one request per connection, until closed."""

    def __init__(self, data: Buffer, host: str = "0.0.0.0", port: int = 0) -> None:
        self.data = memoryview(data).cast("B")
        self.listener = socket.create_server((host, port), backlog=16)
        self.listener.settimeout(0.2)  # the accept loop wakes up this often to see close()
        self.closing = threading.Event()
        self.thread = threading.Thread(target=self._accept, name="plain-accept", daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        """The listening port."""
        return int(self.listener.getsockname()[1])

    def _accept(self) -> None:
        while not self.closing.is_set():
            try:
                sock, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._one, args=(sock,), daemon=True).start()

    def _one(self, sock: socket.socket) -> None:
        with sock, contextlib.suppress(OSError):
            head = bytearray(REQUEST.size)
            recv_exact_into(sock, memoryview(head))
            off, length = REQUEST.unpack(head)
            if off + length <= len(self.data):
                sock.sendall(self.data[off : off + length])

    def close(self) -> None:
        """Stop accepting (connections in progress end on their own)."""
        self.closing.set()
        self.listener.close()
        self.thread.join(2.0)


@dataclass(frozen=True)
class PlainResult:
    """One plain pull: seconds from the first connect to the last byte, and per source
    ``(end_s, bytes)``."""

    delay_s: float
    sources: dict[str, tuple[float, int]]


def pull(
    addresses: Mapping[str, tuple[str, int]],
    ranges: Mapping[str, tuple[int, int]],
    dest: bytearray,
    timeout: float = 120.0,
) -> PlainResult:
    """Fetch ``ranges[source]`` from each source at once into ``dest``.

    Raises:
        OSError: A connection failed or closed early (the pull has no healing).
    """
    view = memoryview(dest)
    ends: dict[str, tuple[float, int]] = {}
    errors: list[BaseException] = []
    t0 = time.monotonic()

    def one(src: str, off: int, length: int) -> None:
        try:
            with socket.create_connection(addresses[src], timeout=timeout) as sock:
                kernel_timeouts(sock, timeout)  # blocking: one system call per chunk
                sock.sendall(REQUEST.pack(off, length))
                for pos in range(off, off + length, RECV_BYTES):
                    recv_into(sock, view[pos : min(off + length, pos + RECV_BYTES)], src)
            ends[src] = (time.monotonic() - t0, length)
        except BaseException as exc:  # re-raised by the caller
            errors.append(exc)

    threads = [
        threading.Thread(target=one, args=(s, o, n), daemon=True)
        for s, (o, n) in ranges.items()
        if n > 0
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return PlainResult(max((e for e, _ in ends.values()), default=0.0), ends)
