"""The new node's side: pull a plan's byte ranges from every neighbour at once, verified.

This module does the I/O; what each source is asked for, and what has arrived and verified,
is kept by a :class:`~chaos_edge.replication.transfer.ledger.Ledger`.

One thread and one connection per source (a direct neighbour, or for relayed strategies a node
reached through a route of hops). Each thread cuts its share into requests of about
``piece_s`` seconds at the source's observed rate, keeps ``pipeline`` of them in flight (more
on a long round trip; while a source's rate is still unknown, no more bytes than it has
delivered, as in TCP's slow start) and reads every DATA frame straight into its place in one
preallocated buffer, so the state is received with no intermediate copy. Rates at run time
differ from the plan's (the streams share the new node's CPU and links change), so a source
that has nothing left to request takes the unrequested tail of the source predicted to finish
last, just enough that both are predicted to finish together
(:mod:`~chaos_edge.replication.transfer.balance`); the sources finish close together whatever the
plan assumed. A checksum block is verified as soon
as all of its bytes are in (blocks that straddle two sources' ranges included); a bad block is
fetched again, first from the source that completed it, then from others, and is never
accepted unverified. A source that fails (refused, connection lost, silent for ``io_timeout``)
becomes state: the bytes it has not delivered are re-planned onto the survivors, by their
observed rates, with :func:`replan_remaining`.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor

from chaos_edge.dataplane import auth
from chaos_edge.replication.errors import PlanError
from chaos_edge.replication.manifest import Manifest, verify_range
from chaos_edge.replication.planning.model import ReplicationPlan
from chaos_edge.replication.transfer import wire
from chaos_edge.replication.transfer.fetch_types import FetchOptions, FetchResult, ProgressFn
from chaos_edge.replication.transfer.ledger import Ledger, Task
from chaos_edge.replication.transfer.wire import Kind


class _Fetch:
    """One fetch: a thread per source around one :class:`Ledger`, guarded by one condition."""

    def __init__(
        self,
        plan: ReplicationPlan,
        manifest: Manifest,
        me: auth.Identity,
        addresses: Mapping[str, tuple[str, int]],
        routes: Mapping[str, Sequence[str]],
        dest: bytearray,
        progress: ProgressFn | None,
        opt: FetchOptions,
    ) -> None:
        if len(dest) != manifest.total_bytes:
            raise PlanError("the buffer and the manifest sizes differ")
        self.ledger = Ledger(plan, manifest, opt)
        self.manifest, self.me, self.opt = manifest, me, opt
        self.addresses, self.routes, self.progress = addresses, routes, progress
        self.dest, self.view = dest, memoryview(dest)
        self.cv = threading.Condition()
        self.socks: dict[str, socket.socket] = {}
        self.stop = False
        # Blocks are verified off the receiving threads: a receiving thread that hashes lets
        # its socket queue fill and its link stall whenever the CPU is contended.
        self.verifier = (
            ThreadPoolExecutor(opt.verify_threads, thread_name_prefix="fetch-verify")
            if opt.verify_threads > 0
            else None
        )

    # -- the source threads ----------------------------------------------------------------
    def worker(self, src: str) -> None:
        inflight: deque[Task] = deque()
        try:
            while True:
                take = self._next(src, len(inflight))
                if take is None:
                    return
                inflight.extend(take)  # before any I/O, so a failure hands them all back
                sock = self.socks.get(src) or self._dial(src)
                for task in take:
                    self._request(sock, src, task)
                self._receive(sock, src, inflight[0])
                inflight.popleft()
        except Exception as exc:  # a failing source is state, never a crash
            with self.cv:
                self.ledger.fail(src, exc, list(inflight), heal=not self.stop)
                self.cv.notify_all()

    def _next(self, src: str, in_flight: int) -> list[Task] | None:
        """The requests ``src`` sends next; waits while it has nothing to do (None: stop)."""
        with self.cv:
            while True:
                if self.stop or src not in self.ledger.alive:
                    return None
                take = self.ledger.next_tasks(src, in_flight)
                if take or in_flight:
                    return take
                self.cv.wait(self.ledger.idle_wait_s())

    def _dial(self, src: str) -> socket.socket:
        hop = self.routes.get(src, [src])[0]
        sock = wire.dial(
            self.addresses[hop],
            self.me,
            hop,
            connect_timeout=self.opt.connect_timeout,
            io_timeout=self.opt.io_timeout,
        )
        wire.kernel_timeouts(sock, self.opt.io_timeout)
        with self.cv:
            self.socks[src] = sock
            if self.stop:  # close() may have run while we dialled
                sock.shutdown(socket.SHUT_RDWR)
        return sock

    def _request(self, sock: socket.socket, src: str, task: Task) -> None:
        hops = list(self.routes.get(src, [src]))[1:]
        version = self.manifest.version
        if hops:
            body = wire.route_payload(hops)
            sock.sendall(wire.encode(Kind.GET_VIA, version, task.offset, task.length, len(body)))
            sock.sendall(body)
        else:
            sock.sendall(wire.encode(Kind.GET, version, task.offset, task.length))

    def _receive(self, sock: socket.socket, src: str, task: Task) -> None:
        pos, end = task.offset, task.offset + task.length
        while pos < end:
            h = wire.read_header(sock, src)
            if h.kind is Kind.ERROR:
                wire.raise_error(h, wire.read_payload(sock, h, src), src)
            n = h.payload
            if (
                h.kind is not Kind.DATA
                or h.offset != pos
                or h.length != n
                or not 0 < n <= end - pos
            ):
                raise wire.ProtocolError(f"{src} sent an unexpected {h.kind.name} frame")
            wire.recv_into(sock, self.view[pos : pos + n], src, batch=True)
            with self.cv:
                complete = self.ledger.arrived(src, task, pos, n)
                done, assigned = self.ledger.done_n[src], self.ledger.assigned_n[src]
            for b in complete:
                self._verify(src, b)
            if self.progress is not None:
                self.progress(src, done, assigned)
            pos += n
        if task.block is not None:
            self._verify(src, task.block)

    def _verify(self, src: str, b: int) -> None:
        if self.verifier is None:
            self._check_block(src, b)
        else:
            self.verifier.submit(self._check_block, src, b)

    def _check_block(self, src: str, b: int) -> None:
        start, size = self.manifest.block_range(b)
        try:
            bad = verify_range(self.manifest, start, self.view[start : start + size])
        except Exception as exc:  # a verifier thread must not die silently
            with self.cv:
                self.ledger.fatal = exc
                self.cv.notify_all()
            return
        with self.cv:
            self.ledger.checked(src, b, not bad)
            self.cv.notify_all()

    # -- driving ---------------------------------------------------------------------------
    def run(self) -> FetchResult:
        led = self.ledger
        threads = [
            threading.Thread(target=self.worker, args=(s,), name=f"fetch-{s}", daemon=True)
            for s in led.order
        ]
        for t in threads:
            t.start()
        deadline = None if self.opt.deadline_s is None else led.t0 + self.opt.deadline_s
        try:
            with self.cv:
                while led.fatal is None and not led.complete:
                    if deadline is not None and time.monotonic() > deadline:
                        led.fatal = wire.TransferError(f"fetch took over {self.opt.deadline_s} s")
                        break
                    self.cv.wait(0.5)
        finally:
            with self.cv:
                self.stop = True
                self.cv.notify_all()
                socks = list(self.socks.values())
            for s in socks:  # wake threads blocked in recv; close only after they are joined
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            for t in threads:
                t.join(self.opt.io_timeout + 1.0)
            for s in socks:
                s.close()
            if self.verifier is not None:
                self.verifier.shutdown(wait=True, cancel_futures=True)
        if led.fatal is not None:
            raise led.fatal
        return FetchResult(
            self.dest, led.t_done, led.timings(), led.replans, led.refetched, led.steals
        )


def fetch(
    plan: ReplicationPlan,
    manifest: Manifest,
    addresses: Mapping[str, tuple[str, int]],
    me: auth.Identity,
    *,
    routes: Mapping[str, Sequence[str]] | None = None,
    dest: bytearray | None = None,
    progress: ProgressFn | None = None,
    options: FetchOptions | None = None,
) -> FetchResult:
    """Fetch every byte of a state as planned, verify it, and heal around failed sources.

    Args:
        plan: Which ranges each source sends (the plan's neighbours are the sources).
        manifest: The state's manifest (version, size, block checksums).
        addresses: Node id -> (host, port) of its state server, for each first hop.
        me: The new node's credentials.
        routes: Source -> hops from the new node to it (first hop: a direct neighbour, last:
            the source). Sources without one are dialled directly.
        dest: Preallocated buffer of ``manifest.total_bytes`` (allocated when None).
        progress: Called after each received chunk (see :data:`ProgressFn`).
        options: Timeouts, window, retry limits.

    Returns:
        The verified buffer, the total delay, and per-source timings.

    Raises:
        VersionMismatchError: No source serves ``manifest.version``.
        CorruptStateError: A block stayed corrupt after every allowed re-fetch.
        TransferError: Every source failed, or the deadline passed.
    """
    buf = dest if dest is not None else bytearray(manifest.total_bytes)
    job = _Fetch(
        plan, manifest, me, addresses, dict(routes or {}), buf, progress, options or FetchOptions()
    )
    return job.run()
