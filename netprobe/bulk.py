"""netprobe's own bandwidth probe over asyncio TCP, for boxes without iperf3.

Protocol, one test per connection::

    client -> server  header: magic "CHBK" | version u8 | 3 pad bytes
    client -> server  payload bytes, then a half-close (EOF)
    server -> client  reply:  magic "CHBK" | version u8 | 3 pad | total u64 | timed u64 | ns u64

The receiver times the transfer, as iperf3 does: ``ns`` runs from the end of its first read to
its last, and ``timed`` counts the bytes read in between. Bytes already buffered in the first
read are excluded because their arrival time is unknown. When everything arrives in one read
(loopback, tiny tests), the client falls back to its own send-to-reply wall time.

Unlike iperf3 the server does not refuse concurrent tests; :func:`bulk_measure` serialises tests
per server inside one process, and tests from different clients share the link as any traffic
would.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
import weakref
from types import TracebackType

from netprobe.errors import BulkProbeError, ProbeTimeout
from netprobe.results import BandwidthResult

MAGIC = b"CHBK"
VERSION = 1
_HEADER = struct.Struct("!4sB3x")
_REPLY = struct.Struct("!4sB3xQQQ")
_CHUNK = 64 * 1024
_ZEROS = bytes(_CHUNK)
DEFAULT_NBYTES = 4 * 1024 * 1024

_locks: weakref.WeakKeyDictionary[
    asyncio.AbstractEventLoop, dict[tuple[str, int], asyncio.Lock]
] = weakref.WeakKeyDictionary()


class BulkProbeServer:
    """Receives bulk probes and reports the receiver's timing.

    Args:
        host: Address to bind.
        port: TCP port; 0 picks a free one (read :attr:`port` after start).
        idle_timeout_s: A client silent for this long is dropped.
        max_bytes: A client sending more than this is cut off (guards against abuse).

    Attributes:
        tests: Completed tests.
    """

    def __init__(
        self,
        host: str = "0.0.0.0",
        port: int = 0,
        *,
        idle_timeout_s: float = 10.0,
        max_bytes: int = 16 * 1024**3,
    ) -> None:
        self.host = host
        self._requested_port = port
        self.idle_timeout_s = idle_timeout_s
        self.max_bytes = max_bytes
        self.tests = 0
        self._server: asyncio.Server | None = None
        self._port: int | None = None

    @property
    def port(self) -> int:
        """The bound port; raises RuntimeError before :meth:`start`."""
        if self._port is None:
            raise RuntimeError("BulkProbeServer.port is only known after start()")
        return self._port

    async def start(self) -> None:
        """Bind and start accepting probes."""
        self._server = await asyncio.start_server(self._handle, self.host, self._requested_port)
        self._port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        """Stop accepting and close open connections. Safe to call twice."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(server.wait_closed(), timeout=2.0)

    async def __aenter__(self) -> BulkProbeServer:
        await self.start()
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            header = await asyncio.wait_for(reader.readexactly(_HEADER.size), self.idle_timeout_s)
            magic, version = _HEADER.unpack(header)
            if magic != MAGIC or version != VERSION:
                return  # not one of ours: just hang up
            total, timed, elapsed_ns = await self._receive(reader)
            writer.write(_REPLY.pack(MAGIC, VERSION, total, timed, elapsed_ns))
            await asyncio.wait_for(writer.drain(), self.idle_timeout_s)
            self.tests += 1
        except (asyncio.TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            pass  # a peer that goes away mid-test is its own problem, never the server's
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _receive(self, reader: asyncio.StreamReader) -> tuple[int, int, int]:
        total = timed = 0
        first_at: int | None = None
        last_at = 0
        while total <= self.max_bytes:
            chunk = await asyncio.wait_for(reader.read(1 << 20), self.idle_timeout_s)
            if not chunk:
                break
            now = time.perf_counter_ns()
            total += len(chunk)
            if first_at is None:
                first_at = now
            else:
                timed += len(chunk)
            last_at = now
        return total, timed, (last_at - first_at) if first_at is not None else 0


def _lock_for(host: str, port: int) -> asyncio.Lock:
    per_loop = _locks.setdefault(asyncio.get_running_loop(), {})
    return per_loop.setdefault((host, port), asyncio.Lock())


async def bulk_measure(
    host: str,
    port: int,
    *,
    nbytes: int | None = None,
    duration_s: float | None = None,
    timeout_s: float = 30.0,
) -> BandwidthResult:
    """Send a bulk probe to a :class:`BulkProbeServer` and return the receiver's timing.

    Args:
        host: The server's address.
        port: The server's port.
        nbytes: Bytes to send (default 4 MiB). Mutually exclusive with ``duration_s``.
        duration_s: Send for this long instead of a fixed byte count.
        timeout_s: Deadline for the whole test.

    Raises:
        ProbeTimeout: The test did not finish in time.
        BulkProbeError: Connection refused or reset, or the server spoke another protocol.
    """
    if nbytes is not None and duration_s is not None:
        raise ValueError("give nbytes or duration_s, not both")
    if nbytes is None and duration_s is None:
        nbytes = DEFAULT_NBYTES
    async with _lock_for(host, port):
        try:
            return await asyncio.wait_for(_run(host, port, nbytes, duration_s), timeout_s)
        except asyncio.TimeoutError:
            raise ProbeTimeout(
                f"bulk probe to {host}:{port} did not finish within {timeout_s:.1f}s; "
                "the link may be down or much slower than expected (raise timeout_s)"
            ) from None
        except (OSError, asyncio.IncompleteReadError) as exc:
            raise BulkProbeError(
                f"bulk probe to {host}:{port} failed: {exc or type(exc).__name__}; "
                "is a netprobe BulkProbeServer listening there?"
            ) from None


async def _run(
    host: str, port: int, nbytes: int | None, duration_s: float | None
) -> BandwidthResult:
    reader, writer = await asyncio.open_connection(host, port)
    try:
        started = time.perf_counter()
        writer.write(_HEADER.pack(MAGIC, VERSION))
        sent = 0
        view = memoryview(_ZEROS)
        while True:
            if nbytes is not None:
                if sent >= nbytes:
                    break
                chunk = view[: min(_CHUNK, nbytes - sent)]
            else:
                assert duration_s is not None
                if time.perf_counter() - started >= duration_s:
                    break
                chunk = view
            writer.write(chunk)
            sent += len(chunk)
            await writer.drain()
        writer.write_eof()
        reply = await reader.readexactly(_REPLY.size)
        wall = time.perf_counter() - started
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
    magic, version, total, timed, elapsed_ns = _REPLY.unpack(reply)
    if magic != MAGIC or version != VERSION:
        raise BulkProbeError(f"bulk probe to {host}:{port}: the server speaks another protocol")
    if total != sent:
        raise BulkProbeError(f"bulk probe to {host}:{port}: sent {sent} bytes, {total} arrived")
    if timed > 0 and elapsed_ns > 0:
        seconds, bps = elapsed_ns / 1e9, timed * 8 / (elapsed_ns / 1e9)
    else:
        seconds, bps = wall, total * 8 / max(wall, 1e-9)
    return BandwidthResult(bits_per_second=bps, bytes=total, seconds=seconds, tool="bulk")
