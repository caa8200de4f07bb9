"""The bookkeeping of one fetch: who sends what next, what has arrived, what is verified.

:class:`Ledger` holds, per source, the bytes not yet requested (a queue of ranges, cut into
requests from its head and stolen from its tail), the bytes in flight, a rate meter, and the
bad blocks to fetch again; per checksum block, how many of its bytes are in and who sent them.
It decides the requests each source sends next (their size follows the source's observed rate,
see :mod:`~chaos_edge.replication.transfer.balance`), moves a slow source's unrequested tail to a
source that runs dry, re-plans the undelivered bytes of a source that fails, and queues the
re-fetch of a bad block. It does no I/O and takes its clock as an argument, so it can be driven
without sockets; :mod:`~chaos_edge.replication.transfer.fetch` runs the threads and holds one
condition around every call (the ledger itself is not thread-safe).
"""

from __future__ import annotations

import dataclasses
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from chaos_edge.replication.errors import CorruptStateError, PlanError
from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.planning.model import (
    Neighbor,
    Range,
    ReplicationPlan,
    merge_ranges,
    subtract_ranges,
)
from chaos_edge.replication.planning.planner import PLANNERS
from chaos_edge.replication.planning.replan import replan_remaining
from chaos_edge.replication.transfer import wire
from chaos_edge.replication.transfer.balance import (
    RateMeter,
    cut_head,
    piece_bytes,
    steal_size,
    take_tail,
)
from chaos_edge.replication.transfer.fetch_types import FetchOptions, SourceTiming, Steal
from chaos_edge.replication.transfer.wire import TransferError, VersionMismatchError


@dataclass(frozen=True)
class Task:
    """One range request to one source."""

    offset: int
    length: int
    block: int | None = None  # set for the re-fetch of a bad block


class Ledger:
    """Who sends what, and what has arrived, during one fetch (see the module docstring).

    Args:
        plan: The planned ranges per source (its neighbours are the sources).
        manifest: The state's manifest (size, checksum blocks).
        opt: Fetch options (request sizes, depth, rebalancing, retry limits).
        clock: Monotonic seconds (a seam for tests).

    Raises:
        PlanError: The plan and the manifest describe states of different sizes.
    """

    def __init__(
        self,
        plan: ReplicationPlan,
        manifest: Manifest,
        opt: FetchOptions,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if plan.inputs.total_bytes != manifest.total_bytes:
            raise PlanError("plan and manifest sizes differ")
        self.plan, self.manifest, self.opt, self.clock = plan, manifest, opt, clock
        self.order = [n.id for n in plan.inputs.neighbors]
        self.info = {n.id: n for n in plan.inputs.neighbors}
        self.queues: dict[str, deque[Range]] = {s: deque() for s in self.order}
        self.repairs: dict[str, deque[Task]] = {s: deque() for s in self.order}
        self.assigned: dict[str, list[Range]] = {s: [] for s in self.order}
        self.done: dict[str, list[Range]] = {s: [] for s in self.order}
        self.delivered = dict.fromkeys(self.order, 0)
        self.assigned_n = dict.fromkeys(self.order, 0)
        self.done_n = dict.fromkeys(self.order, 0)
        self.queued_n = dict.fromkeys(self.order, 0)
        self.inflight_n = dict.fromkeys(self.order, 0)
        self.taken_n = dict.fromkeys(self.order, 0)
        self.given_n = dict.fromkeys(self.order, 0)
        self.meters = {n.id: RateMeter(1.0 / n.t_trans_s_per_byte) for n in plan.inputs.neighbors}
        self.mark: dict[str, float] = {}  # start of the source's current busy stretch
        # Seconds of traffic kept requested ahead: the margin, plus the round trip.
        self.lead_s = {n.id: opt.lead_s + 2 * n.t_prop_s for n in plan.inputs.neighbors}
        self.steals: list[Steal] = []
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.failed: dict[str, BaseException] = {}
        self.alive = set(self.order)
        nb = manifest.num_blocks
        self.got, self.owner, self.tries = [0] * nb, [""] * nb, [0] * nb
        self.verified = 0
        self.refetched: list[int] = []
        self.replans: list[ReplicationPlan] = []
        self.fatal: BaseException | None = None
        self.t0 = clock()
        self.t_done = 0.0
        for src, ranges in plan.ranges.items():
            self.assign(src, ranges)

    @property
    def complete(self) -> bool:
        """Every block has arrived and verified."""
        return self.verified == self.manifest.num_blocks

    def assign(self, src: str, ranges: Sequence[Range]) -> None:
        """Make ``src`` responsible for ``ranges`` (queued behind what it already has)."""
        ranges = [r for r in ranges if r[1] > 0]
        n = sum(length for _, length in ranges)
        self.assigned[src].extend(ranges)
        self.queues[src].extend(ranges)
        self.assigned_n[src] += n
        self.queued_n[src] += n

    # -- what to request -------------------------------------------------------------------
    def next_tasks(self, src: str, in_flight: int) -> list[Task]:
        """The requests ``src`` sends now, given ``in_flight`` requests outstanding."""
        take: list[Task] = []
        while self._wants(src, in_flight + len(take)):
            task = self._pop(src, idle=in_flight + len(take) == 0)
            if task is None:
                break
            take.append(task)
        if take:
            self.start.setdefault(src, self.clock() - self.t0)
        return take

    def idle_wait_s(self) -> float:
        """How long a source with nothing to do waits before it looks again: briefly while
        some source still has unrequested bytes it could take over."""
        busy = self.opt.rebalance and any(self.queued_n[s] for s in self.alive)
        return 0.05 if busy else 0.5

    def _trust(self, src: str) -> int:
        """Most bytes ``src`` may have in flight before its rate is known: what it has already
        delivered (at least ``pipeline`` smallest requests), doubling as it delivers, like TCP's
        slow start. A request commits its bytes to a source; a source that is far slower than
        planned must not be handed its whole share before a byte of it has arrived."""
        return max(self.opt.pipeline * self.opt.min_piece_bytes, self.delivered[src])

    def _wants(self, src: str, requests: int) -> bool:
        """Whether ``src``, with ``requests`` in flight, should be sent another."""
        if requests >= self.opt.window:
            return False
        if self.inflight_n[src] >= self._trust(src):
            return False
        ahead = self.inflight_n[src] / self.meters[src].rate
        return requests < self.opt.pipeline or ahead < self.lead_s[src]

    def _pop(self, src: str, idle: bool) -> Task | None:
        """Cut ``src``'s next request: a repair, else the head of its queue, else a steal."""
        if self.repairs[src]:
            task = self.repairs[src].popleft()
        else:
            queue = self.queues[src]
            if not queue and not self._steal(src):
                return None
            o = self.opt
            size = piece_bytes(self.meters[src].rate, o.piece_s, o.min_piece_bytes,
                               o.max_piece_bytes)  # fmt: skip
            size = min(size, max(o.min_piece_bytes, self._trust(src) // o.pipeline))
            piece, rest = cut_head(queue[0], size, self.manifest.block_size)
            if rest[1]:
                queue[0] = rest
            else:
                queue.popleft()
            self.queued_n[src] -= piece[1]
            task = Task(*piece)
        self.inflight_n[src] += task.length
        if idle:
            self.mark[src] = self.clock()
        return task

    def _steal(self, thief: str) -> bool:
        """Take the tail of the source predicted to finish last, if ``thief`` would finish it
        sooner; returns whether anything moved onto ``thief``'s queue."""
        if not self.opt.rebalance:
            return False
        victim, latest = "", 0.0
        for s in self.order:
            if s != thief and s in self.alive and self.queued_n[s] > 0:
                finish = (self.queued_n[s] + self.inflight_n[s]) / self.meters[s].rate
                if finish > latest:
                    victim, latest = s, finish
        if not victim:
            return False
        left = self.queued_n[victim] + self.inflight_n[victim]
        want = steal_size(left, self.meters[victim].rate, self.inflight_n[thief],
                          self.meters[thief].rate)  # fmt: skip
        want = min(want, self.queued_n[victim])
        if want <= 0 or (want < self.opt.min_piece_bytes and want < self.queued_n[victim]):
            return False  # not worth a request: the victim finishes about as soon
        ranges = take_tail(self.queues[victim], want, self.manifest.block_size)
        n = sum(length for _, length in ranges)
        if n == 0:
            return False
        self.queued_n[victim] -= n
        self.assigned_n[victim] -= n
        self.given_n[victim] += n
        self.assigned[victim] = list(subtract_ranges(self.assigned[victim], ranges))
        self.assign(thief, ranges)
        self.taken_n[thief] += n
        self.steals.append(Steal(thief, victim, tuple(ranges), self.clock() - self.t0))
        return True

    # -- what arrived ----------------------------------------------------------------------
    def arrived(self, src: str, task: Task, off: int, n: int) -> list[int]:
        """``n`` bytes at ``off`` of ``task`` came from ``src``; returns the blocks that are
        now complete and must be verified."""
        now = self.clock()
        self.meters[src].add(n, now - self.mark.get(src, now))
        self.mark[src] = now
        self.inflight_n[src] -= n
        self.delivered[src] += n
        self.end[src] = now - self.t0
        if task.block is not None:
            return []  # a repair: verified by the caller once the whole block is in
        self.done[src].append((off, n))
        self.done_n[src] += n
        bs = self.manifest.block_size
        complete = []
        for b in range(off // bs, (off + n - 1) // bs + 1):
            start, size = self.manifest.block_range(b)
            self.got[b] += min(off + n, start + size) - max(off, start)
            self.owner[b] = src
            if self.got[b] == size:
                complete.append(b)
        return complete

    def checked(self, src: str, b: int, good: bool) -> None:
        """Block ``b`` (last bytes from ``src``) verified ``good`` or not; a bad one is queued
        for a re-fetch, or makes the fetch fail after ``max_block_tries``."""
        if good:
            self.verified += 1
            if self.complete:
                self.t_done = self.clock() - self.t0
            return
        self.tries[b] += 1
        self.refetched.append(b)
        if self.tries[b] > self.opt.max_block_tries:
            self.fatal = CorruptStateError(
                f"block {b} stayed corrupt after {self.opt.max_block_tries} re-fetches", [b]
            )
            return
        self._queue_repair(b, prefer=self.owner[b] or src)

    def _queue_repair(self, b: int, prefer: str) -> None:
        """Queue a re-fetch of block ``b``: the same source first, then rotate."""
        live = [s for s in self.order if s in self.alive]
        if not live:
            return  # fail() has recorded the fatal error
        if prefer in self.alive and self.tries[b] <= self.opt.same_source_tries:
            pick = prefer
        else:
            others = [s for s in live if s != prefer] or live
            pick = others[self.tries[b] % len(others)]
        start, size = self.manifest.block_range(b)
        self.repairs[pick].append(Task(start, size, b))

    # -- failures --------------------------------------------------------------------------
    def fail(self, src: str, exc: BaseException, inflight: Sequence[Task], heal: bool = True
             ) -> None:  # fmt: skip
        """``src`` failed with ``inflight`` requests unanswered: re-plan what it has not
        delivered onto the survivors and move its pending repairs to them (unless not
        ``heal``: the fetch is ending anyway)."""
        if src not in self.alive:
            return
        self.alive.discard(src)
        self.failed[src] = exc
        if not heal:
            return
        repairs = [t for t in [*inflight, *self.repairs[src]] if t.block is not None]
        self.repairs[src].clear()
        self.queues[src].clear()
        self.queued_n[src] = self.inflight_n[src] = 0
        survivors = [s for s in self.order if s in self.alive]
        if not survivors:
            self.fatal = self._no_sources_left()
            return
        try:
            self._replan(src, survivors)
        except PlanError as err:
            self.fatal = TransferError(f"cannot re-plan the bytes of {src}: {err}")
        for t in repairs:
            assert t.block is not None
            self._queue_repair(t.block, prefer="")

    def _replan(self, src: str, survivors: list[str]) -> None:
        """Plan ``src``'s undelivered bytes onto the survivors by their observed rates, each
        after its own backlog."""
        current = dataclasses.replace(
            self.plan, ranges={s: merge_ranges(r) for s, r in self.assigned.items()}
        )
        remaining = []
        for s in survivors:
            n, rate = self.info[s], self.meters[s].rate
            backlog = self.queued_n[s] + self.inflight_n[s]
            remaining.append(Neighbor(s, n.t_prop_s, 1.0 / rate, backlog / rate))
        planner = PLANNERS[self.opt.replan_planner]
        new = replan_remaining(current, src, merge_ranges(self.done[src]), remaining, planner)
        for s, ranges in new.ranges.items():
            self.assign(s, ranges)
        self.replans.append(new)

    def _no_sources_left(self) -> TransferError:
        reasons = "; ".join(f"{s}: {e}" for s, e in self.failed.items())
        if all(isinstance(e, VersionMismatchError) for e in self.failed.values()):
            return VersionMismatchError(
                f"no source serves the wanted version ({reasons})", wire.ErrorCode.VERSION
            )
        return TransferError(f"every source failed; the join cannot complete ({reasons})")

    def timings(self) -> dict[str, SourceTiming]:
        """What each source did (see :class:`SourceTiming`)."""
        return {
            s: SourceTiming(
                s,
                self.start.get(s),
                self.end.get(s),
                self.delivered[s],
                self.assigned_n[s],
                str(self.failed[s]) if s in self.failed else None,
                self.taken_n[s],
                self.given_n[s],
            )
            for s in self.order
        }
