"""The new node's side: pull a plan's byte ranges from every neighbour at once, verified.

One thread and one connection per source (a direct neighbour, or for relayed strategies a node
reached through a route of hops). Each thread pipelines up to ``window`` range requests and reads
every DATA frame straight into its place in one preallocated buffer, so the state is received
with no intermediate copy. A checksum block is verified as soon as all of its bytes are in
(blocks that straddle two neighbours' ranges included); a bad block is fetched again, first from
the neighbour that completed it, then from others, and is never accepted unverified. A source
that fails (refused, connection lost, silent for ``io_timeout``) becomes state: the bytes it has
not delivered are re-planned onto the survivors with :func:`replan_remaining`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import socket
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from daemon.dataplane import auth
from daemon.dataplane.frames import recv_exact_into
from daemon.replication.errors import CorruptStateError, PlanError
from daemon.replication.manifest import Manifest, verify_range
from daemon.replication.planning.model import Neighbor, Range, ReplicationPlan, merge_ranges
from daemon.replication.planning.planner import PLANNERS
from daemon.replication.planning.replan import replan_remaining
from daemon.replication.transfer import wire
from daemon.replication.transfer.fetch_types import (
    FetchOptions,
    FetchResult,
    ProgressFn,
    SourceTiming,
)
from daemon.replication.transfer.wire import Kind, TransferError, VersionMismatchError


@dataclass(frozen=True)
class _Task:
    offset: int
    length: int
    block: int | None = None  # set for the re-fetch of a bad block


class _Fetch:
    """One fetch: the shared state of the source threads, guarded by one condition."""

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
        if plan.inputs.total_bytes != manifest.total_bytes or len(dest) != manifest.total_bytes:
            raise PlanError("plan, manifest and buffer sizes differ")
        self.plan, self.manifest, self.me, self.opt = plan, manifest, me, opt
        self.addresses, self.routes, self.progress = addresses, routes, progress
        self.dest, self.view = dest, memoryview(dest)
        self.order = [n.id for n in plan.inputs.neighbors]
        self.info = {n.id: n for n in plan.inputs.neighbors}
        self.cv = threading.Condition()
        self.queues: dict[str, deque[_Task]] = {s: deque() for s in self.order}
        self.assigned: dict[str, list[Range]] = {s: [] for s in self.order}
        self.done: dict[str, list[Range]] = {s: [] for s in self.order}
        self.delivered = dict.fromkeys(self.order, 0)
        self.assigned_n = dict.fromkeys(self.order, 0)
        self.done_n = dict.fromkeys(self.order, 0)
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.failed: dict[str, BaseException] = {}
        self.alive = set(self.order)
        nb = manifest.num_blocks
        self.got, self.owner = [0] * nb, [""] * nb
        self.tries = [0] * nb
        self.verified = 0
        self.refetched: list[int] = []
        self.replans: list[ReplicationPlan] = []
        self.socks: dict[str, socket.socket] = {}
        self.stop = False
        self.fatal: BaseException | None = None
        self.t0 = time.monotonic()
        self.t_done = 0.0
        for src, ranges in plan.ranges.items():
            self._assign(src, ranges)

    # -- bookkeeping (caller holds self.cv) ------------------------------------------------
    def _assign(self, src: str, ranges: Sequence[Range]) -> None:
        self.assigned[src].extend(r for r in ranges if r[1] > 0)
        self.queues[src].extend(_Task(o, n) for o, n in ranges if n > 0)
        self.assigned_n[src] += sum(n for _, n in ranges)

    # -- the source threads ----------------------------------------------------------------
    def worker(self, src: str) -> None:
        inflight: deque[_Task] = deque()
        try:
            while True:
                with self.cv:
                    while (
                        not self.stop and src in self.alive and not (self.queues[src] or inflight)
                    ):
                        self.cv.wait(0.5)
                    if self.stop or src not in self.alive:
                        return
                    take = [
                        self.queues[src].popleft()
                        for _ in range(min(len(self.queues[src]), self.opt.window - len(inflight)))
                    ]
                inflight.extend(take)  # before any I/O, so a failure hands them all back
                sock = self.socks.get(src) or self._dial(src)
                for task in take:
                    self._request(sock, src, task)
                self._receive(sock, src, inflight[0])
                inflight.popleft()
        except Exception as exc:  # a failing source is state, never a crash
            self._fail(src, exc, list(inflight))

    def _dial(self, src: str) -> socket.socket:
        hop = self.routes.get(src, [src])[0]
        sock = wire.dial(
            self.addresses[hop],
            self.me,
            hop,
            connect_timeout=self.opt.connect_timeout,
            io_timeout=self.opt.io_timeout,
        )
        with self.cv:
            self.socks[src] = sock
            if self.stop:  # close() may have run while we dialled
                sock.shutdown(socket.SHUT_RDWR)
        return sock

    def _request(self, sock: socket.socket, src: str, task: _Task) -> None:
        hops = list(self.routes.get(src, [src]))[1:]
        version = self.manifest.version
        if hops:
            body = wire.route_payload(hops)
            sock.sendall(wire.encode(Kind.GET_VIA, version, task.offset, task.length, len(body)))
            sock.sendall(body)
        else:
            sock.sendall(wire.encode(Kind.GET, version, task.offset, task.length))
        self.start.setdefault(src, time.monotonic() - self.t0)

    def _receive(self, sock: socket.socket, src: str, task: _Task) -> None:
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
            recv_exact_into(sock, self.view[pos : pos + n], src)
            self._arrived(src, task, pos, n)
            pos += n
        if task.block is not None:
            self._check_block(src, task.block)

    def _arrived(self, src: str, task: _Task, off: int, n: int) -> None:
        bs = self.manifest.block_size
        complete: list[int] = []
        with self.cv:
            self.delivered[src] += n
            self.end[src] = time.monotonic() - self.t0
            if task.block is None:
                self.done[src].append((off, n))
                self.done_n[src] += n
                for b in range(off // bs, (off + n - 1) // bs + 1):
                    start, size = self.manifest.block_range(b)
                    self.got[b] += min(off + n, start + size) - max(off, start)
                    self.owner[b] = src
                    if self.got[b] == size:
                        complete.append(b)
            done, assigned = self.done_n[src], self.assigned_n[src]
        for b in complete:
            self._check_block(src, b)
        if self.progress is not None:
            self.progress(src, done, assigned)

    def _check_block(self, src: str, b: int) -> None:
        start, size = self.manifest.block_range(b)
        bad = verify_range(self.manifest, start, self.view[start : start + size])
        with self.cv:
            if not bad:
                self.verified += 1
                if self.verified == self.manifest.num_blocks:
                    self.t_done = time.monotonic() - self.t0
                    self.cv.notify_all()
                return
            self.tries[b] += 1
            self.refetched.append(b)
            if self.tries[b] > self.opt.max_block_tries:
                self.fatal = CorruptStateError(
                    f"block {b} stayed corrupt after {self.opt.max_block_tries} re-fetches", [b]
                )
                self.cv.notify_all()
                return
            self._queue_repair(b, prefer=self.owner[b] or src)

    def _queue_repair(self, b: int, prefer: str) -> None:
        """Queue a re-fetch of block ``b``: the same source first, then rotate (holds cv)."""
        live = [s for s in self.order if s in self.alive]
        if not live:
            return  # _fail has recorded the fatal error
        if prefer in self.alive and self.tries[b] <= self.opt.same_source_tries:
            pick = prefer
        else:
            others = [s for s in live if s != prefer] or live
            pick = others[self.tries[b] % len(others)]
        start, size = self.manifest.block_range(b)
        self.queues[pick].append(_Task(start, size, b))
        self.cv.notify_all()

    def _fail(self, src: str, exc: BaseException, inflight: list[_Task]) -> None:
        with self.cv:
            if src not in self.alive:
                return
            self.alive.discard(src)
            self.failed[src] = exc
            if self.stop:
                return
            repairs = [t for t in [*inflight, *self.queues[src]] if t.block is not None]
            self.queues[src].clear()
            survivors = [s for s in self.order if s in self.alive]
            if not survivors:
                self.fatal = self._no_sources_left()
                self.cv.notify_all()
                return
            try:
                self._replan(src, survivors)
            except PlanError as err:
                self.fatal = TransferError(f"cannot re-plan the bytes of {src}: {err}")
            for t in repairs:
                assert t.block is not None
                self._queue_repair(t.block, prefer="")
            self.cv.notify_all()

    def _replan(self, src: str, survivors: list[str]) -> None:
        """Plan ``src``'s undelivered bytes onto the survivors, each after its own backlog."""
        current = dataclasses.replace(
            self.plan, ranges={s: merge_ranges(r) for s, r in self.assigned.items()}
        )
        remaining = []
        for s in survivors:
            n = self.info[s]
            backlog = self.assigned_n[s] - self.done_n[s]
            remaining.append(
                Neighbor(s, n.t_prop_s, n.t_trans_s_per_byte, backlog * n.t_trans_s_per_byte)
            )
        planner = PLANNERS[self.opt.replan_planner]
        new = replan_remaining(current, src, merge_ranges(self.done[src]), remaining, planner)
        for s, ranges in new.ranges.items():
            self._assign(s, ranges)
        self.replans.append(new)

    def _no_sources_left(self) -> TransferError:
        reasons = "; ".join(f"{s}: {e}" for s, e in self.failed.items())
        if all(isinstance(e, VersionMismatchError) for e in self.failed.values()):
            return VersionMismatchError(
                f"no source serves the wanted version ({reasons})", wire.ErrorCode.VERSION
            )
        return TransferError(f"every source failed; the join cannot complete ({reasons})")

    # -- driving ---------------------------------------------------------------------------
    def run(self) -> FetchResult:
        threads = [
            threading.Thread(target=self.worker, args=(s,), name=f"fetch-{s}", daemon=True)
            for s in self.order
        ]
        for t in threads:
            t.start()
        deadline = None if self.opt.deadline_s is None else self.t0 + self.opt.deadline_s
        try:
            with self.cv:
                while self.fatal is None and self.verified < self.manifest.num_blocks:
                    if deadline is not None and time.monotonic() > deadline:
                        self.fatal = TransferError(f"fetch took over {self.opt.deadline_s} s")
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
        if self.fatal is not None:
            raise self.fatal
        return FetchResult(self.dest, self.t_done, self._timings(), self.replans, self.refetched)

    def _timings(self) -> dict[str, SourceTiming]:
        return {
            s: SourceTiming(
                s,
                self.start.get(s),
                self.end.get(s),
                self.delivered[s],
                self.assigned_n[s],
                str(self.failed[s]) if s in self.failed else None,
            )
            for s in self.order
        }


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
