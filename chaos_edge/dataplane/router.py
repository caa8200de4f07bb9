"""Where a received all-reduce frame goes: the reader threads' side of the AllReducer.

Every frame carries its phase's tag ``(policy version, attempt, step)``. A frame of an epoch
this node has left is dropped (and its sender told to move on); one of the running phase is
claimed by that phase, so its payload lands straight in its final buffer; a control frame of a
phase not opened yet is held (:mod:`chaos_edge.dataplane.early`) and replayed when it opens; a
frame of a newer epoch for the running phase's round aborts it (one for a later round waits:
its sender committed ours). A link going down aborts the phase that needs it.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from chaos_edge.dataplane.errors import PeerGone
from chaos_edge.dataplane.frames import FrameHeader, Kind
from chaos_edge.dataplane.phases import ABORT_SEND_S
from chaos_edge.dataplane.pipeline import RoundPipeline
from chaos_edge.dataplane.rounds import MAX_REASON, Phase, Round, Tag


class FrameRouter(RoundPipeline):
    """The :class:`~chaos_edge.dataplane.conn.FrameHandler` of the all-reduce's frame kinds (a
    layer of :class:`~chaos_edge.dataplane.allreduce.AllReducer`)."""

    def buffer_for(
        self, peer: str, header: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        """Route a frame by its tag: stale -> drop, current -> phase, newer -> hold."""
        tag = header.round_tag
        with self._lock:
            version, attempt = header.epoch
            if attempt > self._seen.get(version, -1):
                self._seen[version] = attempt
            while True:
                ph = self._phase
                current = ph.tag if ph is not None else self._floor
                if tag < current or (tag == current and ph is None):
                    self._drop_stale(peer, header, current)
                    return None
                if ph is not None and tag == current:
                    return ph.claim(peer, header, is_open)
                if (ph is not None and header.epoch > ph.epoch and not ph.aborted
                        and header.serves <= ph.round_step):
                    # Only a newer epoch for our round (or an earlier one) ends ours. One for
                    # a later round comes from a peer that committed ours: our COMMIT is on
                    # its way (the policy of the next round may take effect there, or the
                    # guard's turn may bump the attempt), and aborting now strands us a
                    # round behind, in an epoch every peer has left.
                    ph.abort(f"policy version mismatch: {peer} is at epoch {header.epoch}", peer)
                early = self._early.take(peer, header)
                if early is not None:
                    return early  # a control frame: kept, so the reader reads on
                if not is_open():
                    return None
                self._cond.wait(0.25)

    def _drop_stale(self, peer: str, header: FrameHeader, current: Tag) -> None:
        """A frame of an epoch we have left, or of the phase we just aborted (its sender may
        start it after our ABORT went out): tell the sender to move on."""
        left = header.epoch < current[:2] or (header.round_tag == current and self._lost)
        if header.kind is not Kind.ABORT and left:
            self._tell_stale(peer, header, current)

    def _tell_stale(self, peer: str, header: FrameHeader, current: Tag) -> None:
        """Answer a frame of an epoch we have left with an ABORT of that epoch (called with
        the condition held). Its sender may have joined the epoch after our abort of it went
        out (on a link that was still down then); without this it would wait for us until
        its phase timed out, while we wait for it in the newer epoch."""
        key = (peer, header.round_tag)
        if key in self._told:
            return
        self._told.add(key)
        if len(self._told) > 1024:  # only recent epochs matter
            self._told = {key}
        reason = f"{self.node_id} has left phase {header.round_tag}".encode()[:MAX_REASON]
        reply = FrameHeader(Kind.ABORT, header.step, header.policy_version, 0, 0, len(reason),
                            header.flags)  # fmt: skip

        def send() -> None:
            with contextlib.suppress(PeerGone):
                self.links.send(peer, reply, reason, time.monotonic() + ABORT_SEND_S)

        self._threads.start(send, f"stale-{peer}")

    def on_frame(self, peer: str, header: FrameHeader, payload: memoryview) -> None:
        """Account for a delivered payload."""
        with self._lock:
            ph = self._phase
            early = self._early.landed(peer, header)
            if early is not None:
                if ph is not None and header.round_tag == ph.tag:
                    self._replay(ph, peer, header, early)  # its phase opened meanwhile
                else:
                    current = self._floor if ph is None else ph.tag
                    if header.round_tag > current:
                        self._early.hold(peer, header, early)
                    else:
                        self._drop_stale(peer, header, current)
                return
            if ph is None or header.round_tag != ph.tag:
                return
            self._deliver(ph, peer, header, payload)
        if not isinstance(ph, Round):
            return
        if header.kind is Kind.REDUCE:
            self._pump(ph)  # this chunk may complete the next one: reduce it here and now
        elif header.kind is Kind.BCAST:
            # Passed on as the bytes came (every member holds exactly the root's values), by
            # this reader and outside the lock: the frames of a link stay in order.
            self._bcast_landed(ph, header.chunk, payload)

    def _replay(self, ph: Phase, peer: str, header: FrameHeader, payload: bytes) -> None:
        """Deliver an early control frame to its phase as if it arrived now."""
        dest = ph.claim(peer, header, lambda: True)  # control frames never wait for a slot
        if dest is not None:
            dest[:] = payload
            self._deliver(ph, peer, header, dest)

    def _deliver(self, ph: Phase, peer: str, header: FrameHeader, payload: memoryview) -> None:
        """Account for a frame (condition held); TOTAL goes on to the children at once."""
        ph.delivered(peer, header, payload)
        if isinstance(ph, Round) and header.kind is Kind.TOTAL and not ph.aborted:
            try:
                self._forward_total(ph, ph.deadline)
            except PeerGone as exc:
                ph.abort(f"link to {exc.peer_id} lost: {exc.reason}", exc.peer_id)

    def _on_down(self, peer: str, reason: str) -> None:
        with self._lock:
            self._early.forget(peer)
            ph = self._phase
            if ph is not None and peer in ph.neighbours:
                ph.abort(f"link to {peer} lost: {reason}", peer)
