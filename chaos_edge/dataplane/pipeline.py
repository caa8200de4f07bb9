"""The data path of one all-reduce round: reduce chunk by chunk, pass results on, commit.

Chunks are reduced in order by whichever thread sees the next one ready (the round thread at
the start, the reader that lands a child's chunk, the writer that frees a scratch slot), so no
chunk waits for a thread handoff; each result is queued on a link (REDUCE up, or at the root
BCAST down) and the links' writer threads send it while the reduction goes on. A relay's
reader queues every BCAST chunk for the children as it lands, as the bytes came, then (for a
lossy wire format) decodes it into its own output. Control frames (COUNT, TOTAL, ACK, COMMIT)
go through the same per-link queues, so they never overtake the data before them.

What a chunk's bytes are is the round's :class:`~chaos_edge.dataplane.chunkwire.RoundWire`'s
business; this module only moves them and keeps the counters.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable

import numpy as np

from chaos_edge.dataplane.errors import PeerGone
from chaos_edge.dataplane.frames import Kind
from chaos_edge.dataplane.phases import PhaseRunner
from chaos_edge.dataplane.rounds import Round


class RoundPipeline(PhaseRunner):
    """The round's data path (a layer of :class:`~chaos_edge.dataplane.allreduce.AllReducer`)."""

    def _run_round(self, r: Round, inp: np.ndarray, samples: int, deadline: float) -> None:
        if not self._wait(r, deadline, lambda: all(s.count is not None for s in r.child.values())):
            return
        subtree = samples + sum(s.count or 0 for s in r.child.values())
        if r.parent is not None:
            self._send(r, r.parent, Kind.COUNT, 0, subtree.to_bytes(8, "big"), deadline)
        with self._lock:
            if r.parent is None:
                r.total = subtree
            r.inp, r.samples, r.started = inp, samples, True
            self._forward_total(r, deadline)  # unless its reader already did (or will)
        try:
            self._pump(r)
            if not self._wait(r, deadline, lambda: r.reduced == r.nchunks and (
                    r.parent is None or r.bcast_ready == r.nchunks)):  # fmt: skip
                return
        finally:
            with self._lock:  # a reader may still be reducing or decoding into out
                while r.pumping or r.decoding:
                    self._cond.wait(0.1)
        self._commit(r, deadline)

    def _pump(self, r: Round) -> None:
        """Reduce and queue every chunk that is ready, in order; one thread at a time, so
        chunks go out in order. Called with no lock held; never raises."""
        with self._lock:
            if r.pumping or not r.next_ready():
                return
            r.pumping = True
        owned = True  # only the pumping thread clears the flag
        try:
            while True:
                i = r.reduced
                payload = r.reduce_chunk(i)
                with self._lock:
                    r.reduced = i + 1
                    for state in r.child.values():
                        state.consumed += 1
                    if r.blocked or r.reduced == r.nchunks:
                        self._cond.notify_all()  # readers waiting for a slot; the round thread
                    more = r.next_ready()
                if r.parent is not None:
                    self._post(r, r.parent, Kind.REDUCE, i, payload, r.deadline,
                               functools.partial(self._up_sent, r, i))
                else:
                    self._post_down(r, i, payload, r.deadline)
                if more:
                    continue  # still ours; readiness only grows while we hold the pump
                with self._lock:  # checked and given up at once: no chunk is left behind
                    if not r.next_ready():
                        r.pumping = owned = False
                        if r.aborted or r.reduced == r.nchunks:
                            self._cond.notify_all()  # the round thread may wait for this
                        return
        except PeerGone as exc:
            with self._lock:
                r.abort(f"link to {exc.peer_id} lost: {exc.reason}", exc.peer_id)
        finally:
            if owned:  # left by an exception
                with self._lock:
                    r.pumping = False
                    self._cond.notify_all()

    def _forward_total(self, r: Round, deadline: float) -> None:
        """Queue TOTAL for the children once it is known and the round has started (called
        with the condition held, by whichever thread sees both first)."""
        if r.started and r.total is not None and not r.total_forwarded and not r.aborted:
            r.total_forwarded = True
            for c in r.children:
                self._post(r, c, Kind.TOTAL, 0, r.total.to_bytes(8, "big"), deadline)

    def _post_down(self, r: Round, i: int, payload: memoryview, deadline: float) -> None:
        """Queue BCAST chunk ``i`` for every child (the root's own, or a relay's)."""
        done = None
        if self.fault_hook is not None:  # the hook fires once every child has the chunk
            if not r.children:
                self._fire("bcast", i)
                return
            done = self._countdown(len(r.children), "bcast", i)
        for c in r.children:
            self._post(r, c, Kind.BCAST, i, payload, deadline, done)

    def _bcast_landed(self, r: Round, i: int, payload: memoryview) -> None:
        """A BCAST chunk is in (reader thread, no lock held): pass the same bytes on to the
        children, then decode them into out (lossy formats; fp32 landed in out already)."""
        if not r.aborted:
            try:
                self._post_down(r, i, payload, r.deadline)
            except PeerGone as exc:
                with self._lock:
                    r.abort(f"link to {exc.peer_id} lost: {exc.reason}", exc.peer_id)
        if r.wire.identity:
            return
        decoded = False
        try:
            if not r.aborted:
                r.wire.bcast_decode(i)
                decoded = True
        finally:
            with self._lock:
                r.decoding -= 1
                r.bcast_ready += decoded
                if r.bcast_ready == r.nchunks or not r.decoding:
                    self._cond.notify_all()

    def _up_sent(self, r: Round, i: int, written: bool) -> None:
        """A REDUCE chunk left (or was dropped): its scratch slot is free (writer thread)."""
        if written:
            self._fire("reduce", i)
        with self._lock:
            r.up_sent += 1
        self._pump(r)  # the next chunk may have waited for that slot

    def _countdown(self, n: int, event: str, index: int) -> Callable[[bool], None]:
        left, lock = [n], threading.Lock()

        def done(written: bool) -> None:
            with lock:
                left[0] -= written
                last = left[0] == 0 and written
            if last:
                self._fire(event, index)

        return done

    def _commit(self, r: Round, deadline: float) -> None:
        with self._lock:
            r.complete = True
            if r.parent is None and r.all_acked() and not r.aborted:
                r.done = True  # every ACK came before we got here: committed now
        if not self._wait(r, deadline, r.all_acked):
            return
        if r.parent is not None:
            self._send(r, r.parent, Kind.ACK, 0, b"", deadline)
            self._fire("ack", 0)
            if not self._wait(r, deadline, lambda: r.commit_received):
                return
        with self._lock:
            r.done = True  # committed: nothing after this point can turn into an abort
        self._fire("committed", 0)
        for i, c in enumerate(r.children):
            with contextlib.suppress(PeerGone):  # that child is uncertain and will re-agree
                self._send(r, c, Kind.COMMIT, 0, b"", deadline)
            self._fire("commit", i)
