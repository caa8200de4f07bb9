"""State of one phase (an all-reduce round or an agreement), shared with the reader threads.

Every method here runs with the owning AllReducer's condition variable held. Reader threads
call ``claim`` (where does this payload go?) and ``delivered``; the phase's own thread reads
the counters, reduces chunks, and frees ring slots. Any inconsistency aborts the phase instead
of ever writing a byte to the wrong place.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from chaos_edge.dataplane.chunkwire import RoundWire
from chaos_edge.dataplane.errors import DataPlaneError
from chaos_edge.dataplane.frames import FrameHeader, Kind

MAX_REASON = 1024  # bytes of an ABORT frame's reason text
Tag = tuple[int, int, int]  # (policy_version, attempt, step); step -1 is the agreement phase


class Phase:
    """What an all-reduce round and an agreement share: the tree position, abort, ABORT frames.

    Args:
        tag: ``(policy_version, attempt, step)``.
        parent: Parent in the tree (None at the root).
        children: Children, in a fixed order.
        cond: The AllReducer's condition variable.
        round_step: The training round the phase serves (default: the tag's step; an
            agreement opens the epoch of round ``committed + 1``).
    """

    def __init__(
        self, tag: Tag, parent: str | None, children: tuple[str, ...], cond: threading.Condition,
        round_step: int | None = None,
    ) -> None:  # fmt: skip
        self.tag = tag
        self.round_step = tag[2] if round_step is None else round_step
        self.parent, self.children = parent, children
        self.cond = cond
        self.done = False  # set once the outcome is final here; later aborts are ignored
        self.abort_reason: str | None = None
        self.abort_peer: str | None = None
        self.abort_from_frame = False
        self.deadline = math.inf  # set when the phase starts

    def live(self) -> bool:
        """Whether the phase has not aborted (its queued frames are still worth sending)."""
        return self.abort_reason is None

    @property
    def version(self) -> int:
        """Sync-policy version."""
        return self.tag[0]

    @property
    def attempt(self) -> int:
        """Rerun counter within the policy version."""
        return self.tag[1]

    @property
    def step(self) -> int:
        """Training step (-1 for an agreement)."""
        return self.tag[2]

    @property
    def epoch(self) -> tuple[int, int]:
        """``(policy_version, attempt)``."""
        return self.tag[0], self.tag[1]

    @property
    def neighbours(self) -> tuple[str, ...]:
        """Parent and children."""
        return (*((self.parent,) if self.parent else ()), *self.children)

    @property
    def aborted(self) -> bool:
        """Whether the phase has been aborted."""
        return self.abort_reason is not None

    def abort(self, reason: str, peer: str | None = None, from_frame: bool = False) -> None:
        """Mark the phase aborted (first reason wins; no-op once done) and wake everyone."""
        if self.abort_reason is None and not self.done:
            self.abort_reason, self.abort_peer, self.abort_from_frame = reason, peer, from_frame
        self.cond.notify_all()

    def claim(self, peer: str, h: FrameHeader, is_open: Callable[[], bool]) -> memoryview | None:
        """Destination of a frame carrying this phase's tag, or None to discard it."""
        if self.aborted or self.done:
            return None
        if h.kind is Kind.ABORT:
            if peer in self.neighbours and h.length <= MAX_REASON:
                return memoryview(bytearray(h.length))
            return self.violation(peer, h, "unexpected ABORT")
        return self.claim_own(peer, h, is_open)

    def delivered(self, peer: str, h: FrameHeader, payload: memoryview) -> None:
        """Account for a payload that has landed where ``claim`` said."""
        if h.kind is Kind.ABORT:
            text = bytes(payload).decode("utf-8", "replace")
            self.abort(f"{peer} aborted the round: {text}", peer, from_frame=True)
            self.cond.notify_all()
        elif self.delivered_own(peer, h, payload) is not False:
            self.cond.notify_all()

    def claim_own(
        self, peer: str, h: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        """Subclass part of :meth:`claim`."""
        raise NotImplementedError

    def delivered_own(self, peer: str, h: FrameHeader, payload: memoryview) -> bool | None:
        """Subclass part of :meth:`delivered`; False when no waiter needs waking."""
        raise NotImplementedError

    def sized(self, peer: str, h: FrameHeader, view: memoryview, want: int) -> memoryview | None:
        """``view`` if the payload has exactly ``want`` bytes, else a protocol violation."""
        if h.length != want:
            return self.violation(peer, h, f"payload of {h.length} bytes, expected {want}")
        return view

    def violation(self, peer: str, h: FrameHeader, what: str) -> memoryview | None:
        """Abort on a frame that does not fit, keeping the link (the payload is discarded)."""
        self.abort(f"protocol violation by {peer}: {what} ({h.kind.name} chunk {h.chunk})", peer)
        return None


@dataclass
class ChildState:
    """Progress of one child's upward stream.

    Attributes:
        count: Samples in the child's subtree, once its COUNT frame arrived.
        received: Chunks fully received (into the child's ring of receive slots).
        consumed: Chunks already added into the partial sum (their slots are free again).
        acked: Whether the child's whole subtree holds the complete result.
    """

    count: int | None = None
    received: int = 0
    consumed: int = 0
    acked: bool = False
    scratch: bytearray = field(default_factory=lambda: bytearray(8))


class InputFeed:
    """A round's input that is still being written while the round runs (a backward pass
    producing the gradients, overlapped with their all-reduce).

    Values ``[0, upto)`` and ``[limit, size)`` are in; a chunk is reduced and sent only once
    all of its values are. The writer calls :meth:`advance` as it goes; the round calls
    :meth:`bind` so that an advance wakes its pump. Every member lays its input out the same
    way; only when each chunk leaves depends on this feed.

    Args:
        limit: Where the values that come in late end (the gradients' segment).
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.upto = 0
        self.complete = threading.Event()  # set once upto reaches limit
        self._bound: tuple[threading.Condition, Callable[[], None]] | None = None

    def covers(self, hi: int) -> bool:
        """Whether the values below ``hi`` are all in (read under the round's lock)."""
        return min(hi, self.limit) <= self.upto

    def advance(self, upto: int) -> None:
        """Values ``[0, upto)`` are in (it only grows)."""
        self.upto = max(self.upto, min(upto, self.limit))  # before reading _bound: see bind
        if self.upto == self.limit:
            self.complete.set()
        bound = self._bound
        if bound is not None:
            with bound[0]:  # a pump that checked readiness before the write has given up
                pass
            bound[1]()

    def bind(self, lock: threading.Condition, pump: Callable[[], None] | None) -> None:
        """Wake ``pump`` on every advance (None: stop). A round binds before it starts and
        pumps at its start, so an advance made before the bind is seen then."""
        self._bound = None if pump is None else (lock, pump)


class Round(Phase):
    """One round of reduce, broadcast, then commit on this node: the progress counters the
    round thread, the pumping thread and the readers share. The chunk arithmetic and the
    buffers, in the policy's wire format, are the :class:`RoundWire`'s.

    Args:
        tag: ``(policy_version, attempt, step)``.
        parent: Parent in the tree (None at the root).
        children: Children, in the fixed order their sums are added.
        wire: The round's chunk arithmetic and buffers (the output among them).
        cond: The AllReducer's condition variable.
    """

    def __init__(
        self, tag: Tag, parent: str | None, children: tuple[str, ...], wire: RoundWire,
        cond: threading.Condition,
    ) -> None:  # fmt: skip
        super().__init__(tag, parent, children, cond)
        self.wire = wire
        self.out = wire.out
        self.nchunks = wire.plan.nchunks
        self.ring = wire.ring
        self.child = {c: ChildState() for c in children}
        self.total: int | None = None
        self.total_buf = bytearray(8)
        self.bcast_received = 0  # BCAST chunks landed
        self.bcast_ready = 0  # BCAST chunks in out (decoded, for a lossy format)
        self.decoding = 0  # readers decoding a BCAST chunk into out right now
        self.complete = False  # this node holds the whole result (it may still be uncommitted)
        self.commit_received = False
        self.started = False  # links are up: TOTAL/BCAST may be forwarded to the children
        self.total_forwarded = False
        self.up_sent = 0  # partial sums written to the parent (their scratch slots are free)
        self.inp: np.ndarray = np.empty(0, np.float32)  # this node's gradient, once started
        self.samples = 0
        self.reduced = 0  # chunks reduced (and queued to go up, or down at the root)
        self.pumping = False  # a thread is reducing chunks (only one at a time)
        self.blocked = 0  # readers waiting for a free ring slot
        self.feed: InputFeed | None = None  # an input still being written, if any

    def next_ready(self) -> bool:
        """Whether the next chunk can be reduced: every child's chunk is in, and a scratch
        slot is free for the partial sum (only ``ring`` of them may wait to be written)."""
        i = self.reduced
        if i >= self.nchunks or not self.started or self.aborted:
            return False
        for s in self.child.values():
            if s.received <= i:
                return False
        if self.feed is not None and not self.feed.covers(self.wire.plan.bounds(i)[1]):
            return False
        if self.parent is None or self.wire.sends_input(self.samples):
            return True  # the result goes to out, or inp itself is sent
        return self.up_sent > i - self.ring

    def reduce_chunk(self, i: int) -> memoryview:
        """Reduce chunk ``i`` (:meth:`RoundWire.reduce`); the bytes to send."""
        return self.wire.reduce(self.inp, self.samples, self.total, i)

    def all_acked(self) -> bool:
        """Whether every child reported that its subtree holds the result."""
        return all(s.acked for s in self.child.values())

    def claim_own(
        self, peer: str, h: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        plan = self.wire.plan
        if peer == self.parent and h.kind is Kind.TOTAL and self.total is None:
            return self.sized(peer, h, memoryview(self.total_buf), 8)
        if peer == self.parent and h.kind is Kind.BCAST and self.total is not None:
            if h.chunk != self.bcast_received or h.aux != self.out.size:
                return self.violation(peer, h, "out-of-order chunk or buffer size mismatch")
            return self.sized(peer, h, self.wire.bcast_dest(h.chunk), plan.chunk_bytes(h.chunk))
        if peer == self.parent and h.kind is Kind.COMMIT and self.complete:
            return self.sized(peer, h, memoryview(bytearray(0)), 0)
        state = self.child.get(peer)
        if state is not None and h.kind is Kind.ACK and state.received == self.nchunks:
            return self.sized(peer, h, memoryview(bytearray(0)), 0)
        if state is not None and h.kind is Kind.COUNT and state.count is None:
            return self.sized(peer, h, memoryview(state.scratch), 8)
        if state is not None and h.kind is Kind.REDUCE and state.count is not None:
            if h.chunk != state.received or h.aux != self.out.size:
                return self.violation(peer, h, "out-of-order chunk or buffer size mismatch")
            # Back-pressure: wait for the reduction to free this ring slot.
            while state.received - state.consumed >= self.ring:
                if self.aborted or not is_open():
                    return None
                self.blocked += 1
                self.cond.wait(0.25)
                self.blocked -= 1
            slot = self.wire.child_slot(peer, h.chunk)
            return self.sized(peer, h, slot.data, plan.chunk_bytes(h.chunk))
        return self.violation(peer, h, "frame does not fit this node's role in the tree")

    def delivered_own(self, peer: str, h: FrameHeader, payload: memoryview) -> bool | None:
        # Chunks wake nobody: the round thread waits only for the last broadcast chunk, and
        # a landed REDUCE chunk is reduced by whichever thread pumps (see AllReducer._pump).
        if h.kind is Kind.TOTAL:
            self.total = int.from_bytes(self.total_buf, "big")
        elif h.kind is Kind.BCAST:
            self.bcast_received += 1
            if self.wire.identity:  # it landed in out; a lossy chunk is decoded first
                self.bcast_ready += 1
                return self.bcast_ready == self.nchunks
            self.decoding += 1
            return False
        elif h.kind is Kind.COMMIT:
            # The commit point of a child: from here on the round is final here. Set it on
            # the reader thread, before the link's own end (often right behind COMMIT when
            # the root finished training) can abort a round the root already committed.
            self.commit_received = self.done = True
        elif h.kind is Kind.ACK:
            self.child[peer].acked = True
            if self.parent is None and self.complete and self.all_acked():
                self.done = True  # the root's commit point: every member holds the result
        elif h.kind is Kind.COUNT:
            self.child[peer].count = int.from_bytes(self.child[peer].scratch, "big")
        elif h.kind is Kind.REDUCE:
            self.child[peer].received += 1
            return False
        return True


def as_flat_float32(buf: Any) -> tuple[np.ndarray, Callable[[np.ndarray], Any] | None]:
    """A flat float32 numpy view of ``buf``, plus a converter back for torch inputs."""
    to_torch = None
    if type(buf).__module__.startswith("torch"):
        import torch

        if buf.device.type != "cpu" or buf.dtype != torch.float32:
            raise DataPlaneError("all-reduce needs a float32 CPU tensor")
        buf = buf.detach().contiguous().numpy()
        to_torch = torch.from_numpy
    arr = np.asarray(buf)
    if arr.dtype != np.float32:
        raise DataPlaneError(f"all-reduce needs float32 values, got {arr.dtype}")
    return np.ascontiguousarray(arr).reshape(-1), to_torch


def as_out_buffer(out: Any, inp: np.ndarray) -> np.ndarray:
    """A flat float32 numpy view of a caller's result buffer; never a copy, never ``inp``."""
    if type(out).__module__.startswith("torch"):
        contiguous = bool(out.is_contiguous())
    else:
        contiguous = isinstance(out, np.ndarray) and out.flags.c_contiguous
    if not contiguous:
        raise DataPlaneError("out must be a contiguous numpy array or torch tensor")
    arr, _ = as_flat_float32(out)
    if arr.size != inp.size or not arr.flags.writeable:
        raise DataPlaneError(f"out must be a writable buffer of {inp.size} float32 values")
    if np.may_share_memory(arr, inp):
        raise DataPlaneError("out must not overlap grad")
    return arr
