"""The part of the all-reduce that rounds and agreements share: the node's phase state,
bounded waits, frames to tree neighbours, and the agreement that opens every epoch.

:class:`PhaseRunner` is the base of :class:`~chaos_edge.dataplane.allreduce.AllReducer`; the data
path of a round is :mod:`chaos_edge.dataplane.pipeline`, the routing of received frames
:mod:`chaos_edge.dataplane.router`. All of them share one condition variable (``_cond``) over one
lock: every phase counter is read and written with it held.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable

from chaos_edge.dataplane.agree import Agreement, Summary, decide
from chaos_edge.dataplane.chunkwire import BufferPool, Feedback, Plans
from chaos_edge.dataplane.early import EarlyFrames
from chaos_edge.dataplane.errors import PeerGone
from chaos_edge.dataplane.fences import Fences
from chaos_edge.dataplane.frames import MAX_PAYLOAD, FrameHeader, Kind, phase_flags
from chaos_edge.dataplane.links import PeerLinks
from chaos_edge.dataplane.rounds import MAX_REASON, Phase, Round, Tag
from chaos_edge.dataplane.threads import ThreadSet

#: Test seam: ``hook(event, index)`` after each send: "reduce"/"bcast" (chunk), "ack",
#: "commit" (child index), "agree-up", "agree-down" (child index); and "committed" (0) at a
#: round's commit point, before any COMMIT goes down.
FaultHook = Callable[[str, int], None]
ABORT_SEND_S = 2.0


class PhaseRunner:
    """Phase state of one node and the helpers every phase uses.

    Args:
        links: This node's started PeerLinks.
        chunk_bytes: Pipeline chunk size (a multiple of 4, at most MAX_PAYLOAD), or None to
            size chunks by the round's vector (``chunkwire.auto_chunk_elems``: about 12
            chunks, 1 to 16 MiB each). Every member of a cluster must use the same.
        ring: Receive slots per child; memory is ``ring * chunk_bytes`` per child.
        timeout: Default seconds a round may take before it aborts.
        fault_hook: Test seam, see FaultHook.
    """

    def __init__(
        self,
        links: PeerLinks,
        *,
        chunk_bytes: int | None = 1 << 20,
        ring: int = 4,
        timeout: float = 30.0,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if chunk_bytes is not None and (chunk_bytes % 4 or not 0 < chunk_bytes <= MAX_PAYLOAD):
            raise ValueError("chunk_bytes must be None or a multiple of 4 in (0, MAX_PAYLOAD]")
        if ring < 1:
            raise ValueError("ring must be >= 1")
        self.links, self.node_id = links, links.me.node_id
        self.ring, self.timeout = ring, timeout
        self.chunk_elems = None if chunk_bytes is None else chunk_bytes // 4
        self.fault_hook = fault_hook
        # "with self._lock" where only mutual exclusion is needed: the Condition's own
        # __enter__ is a Python-level call, and the hot path takes the lock several times
        # per chunk. Waits and notifies go through the Condition over the same lock.
        self._lock = threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._phase: Phase | None = None
        self._floor: Tag = (-1, -1, -1)  # tag of the last phase started here
        self._seen: dict[int, int] = {}  # policy version -> newest attempt seen on the wire
        self._told: set[tuple[str, Tag]] = set()  # stale phases we answered with an ABORT
        self._lost = False  # whether the last phase run here (the floor) aborted
        self._early = EarlyFrames()  # control frames of phases not opened yet
        self._fences = Fences()  # newer policies: phases they make pointless abort at once
        self._threads = ThreadSet()  # ABORT replies to stale phases, joined on close
        # Buffers reused by every round (see RoundWire): a child's ring is written only by
        # that child's reader, and a round ends only once nothing reduces from them any more.
        self._pool = BufferPool()
        self._plans = Plans(self.chunk_elems)
        # int8 residuals, staged until a result is applied: one set per lane (a streaming
        # round's fragment), the last round's in ``_feedback``.
        self._feedback = Feedback()
        self._lanes: dict[int, Feedback] = {0: self._feedback}

    def _use_lane(self, lane: int) -> None:
        """The next round's lossy values are lane ``lane``'s: stage in its residuals."""
        self._feedback = self._lanes.setdefault(lane, Feedback())

    # -- agreement -------------------------------------------------------------------------
    def _run_agreement(self, ag: Agreement, own: Summary, deadline: float) -> None:
        if not self._wait(ag, deadline, ag.children_reported):
            return
        summary = own
        for c in ag.children:
            child = ag.child_summary[c]
            assert child is not None
            summary = summary.merge(child)
        if ag.parent is not None:
            self._send(ag, ag.parent, Kind.AGREE_UP, 0, summary.pack(), deadline)
            self._fire("agree-up", 0)
            if not self._wait(ag, deadline, lambda: ag.decision is not None):
                return
        else:  # the root's own digest breaks a tie, if it is of the newest step
            mine = own.tally[0][0] if own.tally and own.high == summary.high else b""
            ag.decision = decide(summary, mine)
        assert ag.decision is not None
        with self._lock:
            ag.done = True  # the decision is known here; a child that misses it re-agrees
        for i, c in enumerate(ag.children):
            with contextlib.suppress(PeerGone):
                self._send(ag, c, Kind.AGREE_DOWN, 0, ag.decision.pack(), deadline)
            self._fire("agree-down", i)

    # -- helpers ---------------------------------------------------------------------------
    def _wait(self, ph: Phase, deadline: float, ready: Callable[[], bool]) -> bool:
        with self._lock:
            return self._wait_locked(ph, deadline, ready)

    def _wait_locked(self, ph: Phase, deadline: float, ready: Callable[[], bool]) -> bool:
        """Wait for ``ready()``; False (with the phase aborted) on abort or timeout."""
        while not ph.aborted and not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                ph.abort(f"timed out after waiting for neighbours {list(ph.neighbours)}")
                break
            self._cond.wait(min(left, 0.5))
        return not ph.aborted

    def _send(
        self, ph: Phase, peer: str, kind: Kind, chunk: int, payload: bytes | memoryview,
        deadline: float,
    ) -> None:  # fmt: skip
        aux = ph.out.size if isinstance(ph, Round) and kind in (Kind.REDUCE, Kind.BCAST) else 0
        flags = phase_flags(ph.attempt, agreement=isinstance(ph, Agreement))
        # An agreement's frames carry the round it opens (FrameHeader.serves).
        header = FrameHeader(kind, max(ph.round_step, 0), ph.version, aux, chunk, len(payload),
                             flags)  # fmt: skip
        self.links.send(peer, header, payload, deadline)

    def _post(
        self, r: Round, peer: str, kind: Kind, chunk: int, payload: bytes | memoryview,
        deadline: float, done: Callable[[bool], None] | None = None,
    ) -> None:  # fmt: skip
        """Queue a frame of round ``r``; it is dropped unsent if the round aborts first."""
        aux = r.out.size if kind in (Kind.REDUCE, Kind.BCAST) else 0
        header = FrameHeader(kind, r.step, r.version, aux, chunk, len(payload),
                             phase_flags(r.attempt, agreement=False))
        self.links.post(peer, header, payload, deadline, r.live, done)

    def _fire(self, event: str, index: int) -> None:
        if self.fault_hook is not None:
            self.fault_hook(event, index)

    def _propagate_abort(self, ph: Phase) -> None:
        reason = (ph.abort_reason or "aborted").encode()[:MAX_REASON]
        deadline = time.monotonic() + ABORT_SEND_S
        for peer in ph.neighbours:
            if ph.abort_from_frame and peer == ph.abort_peer:
                continue
            with contextlib.suppress(PeerGone):  # that neighbour then sees the link drop
                self._send(ph, peer, Kind.ABORT, 0, reason, deadline)
