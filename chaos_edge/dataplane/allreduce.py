"""Synchronous, chunked, pipelined tree all-reduce with an atomic commit over PeerLinks.

**Data flow.** Each node scales its gradient by its local sample count; partial sums flow
towards the root chunk by chunk, the root divides each chunk by the global sample count and
broadcasts it back down, and every node forwards broadcast chunks to its children as they
arrive. Only the root computes the final values, so every holder has bit-identical results.
In a lossy wire format (``policy.wire``: fp16, bf16, int8) partial sums are encoded on the
way up, the root encodes each final chunk once, and every member, the root included, decodes
those same bytes, so this still holds (:mod:`chaos_edge.dataplane.chunkwire`). The modules:
``phases`` (shared state, waits, the agreement), ``pipeline`` (a round's data path),
``router`` (received frames), ``rounds`` (a phase's counters), ``chunkwire`` (the bytes).

**Commit.** Holding the result is not enough to apply it: a node whose subtree holds the whole
result sends ``ACK`` to its parent (a leaf as soon as it holds it; an inner node once every
child acked too). The root, holding every ACK, *commits* and sends ``COMMIT`` down; a node
applies the result (``allreduce`` returns) only on ``COMMIT``. A node that aborts while holding
the result but before ``COMMIT`` is *uncertain*: ``RoundAborted.result`` carries the result.

**Epochs and agreement.** Rounds are tagged ``(policy version, attempt, step)``; an abort
makes the caller rerun the step in a newer epoch (a newer policy version, else the same
version with ``attempt + 1``). Every epoch opens with :meth:`AllReducer.agree`: each member
reports its last committed step ``c`` and whether it is uncertain about round ``c + 1``; the
root decides (``agree.decide``) and the members that are one step behind apply their held
result. Frames of an older epoch are dropped; frames of a newer epoch abort the current phase.

**Why every survivor ends bit-identical at the same step.** (1) The root commits round
``(e, s)`` only after every member of epoch ``e`` held its result (ACKs are transitive). (2) So
if any survivor committed ``s``, every member of ``e`` holds that result or committed it; a
member in between is uncertain, and the next agreement makes it apply the result it holds.
(3) If no survivor committed ``s``, the agreement sees everyone at ``s - 1``. If every one of
them holds the result, they all apply it: a root outside the new epoch (frozen, then thawed
with every ACK in its socket) may have committed it, and must not be contradicted. Else they
all drop what they hold, consistently: a member lacks the result, so it never acked, and no
root committed (a new member aside, which trained on none of it). (4) A round
``s + 1`` can never commit while some member is still at ``s - 1``: that member is not in the
round, so the root lacks its ACK. Hence committed steps differ by at most one, the agreement
always closes the gap, and a phase that aborts on some node never completes anywhere without
it except by a newer epoch, which starts with an agreement. Nodes outside the newest policy
must be re-replicated before they take part again (the Trainer enforces this).

A timeout, a lost link, a protocol violation, a neighbour's ABORT or a newer policy that
governs the round (:meth:`AllReducer.supersede`) aborts the phase; the abort is forwarded to
the other tree neighbours so nobody waits for a dead round, and the caller gets
:class:`RoundAborted`. A node that has committed never reports an abort.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from chaos_edge.dataplane.agree import Agreement, Decision, Summary
from chaos_edge.dataplane.chunkwire import RoundWire
from chaos_edge.dataplane.errors import DataPlaneError, PeerGone, RoundAborted
from chaos_edge.dataplane.frames import Kind
from chaos_edge.dataplane.links import PeerLinks
from chaos_edge.dataplane.phases import ABORT_SEND_S, FaultHook
from chaos_edge.dataplane.rounds import InputFeed, Phase, Round, as_flat_float32, as_out_buffer
from chaos_edge.dataplane.router import FrameRouter
from daemon.contracts.policy import SyncPolicy

__all__ = ["AllReducer", "FaultHook", "ReduceResult"]

log = logging.getLogger("chaos.dataplane.allreduce")
_KINDS = (Kind.COUNT, Kind.TOTAL, Kind.REDUCE, Kind.BCAST, Kind.ABORT, Kind.ACK, Kind.COMMIT,
          Kind.AGREE_UP, Kind.AGREE_DOWN)  # fmt: skip


@dataclass(frozen=True)
class ReduceResult:
    """Outcome of a committed round.

    Attributes:
        values: The global average, same type as the input (numpy array or torch tensor).
        total_samples: Global sample count the sum was divided by.
        step: Training step of the round.
        policy_version: Sync-policy version of the round.
    """

    values: Any
    total_samples: int
    step: int
    policy_version: int



class AllReducer(FrameRouter):
    """Runs all-reduce rounds and agreements for one node over its PeerLinks.

    The layers: :class:`~chaos_edge.dataplane.phases.PhaseRunner` (phase state, waits, sends,
    the agreement), :class:`~chaos_edge.dataplane.pipeline.RoundPipeline` (a round's data path),
    :class:`~chaos_edge.dataplane.router.FrameRouter` (received frames); this class adds the
    public calls and the phase lifecycle.

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
        super().__init__(links, chunk_bytes=chunk_bytes, ring=ring, timeout=timeout,
                         fault_hook=fault_hook)
        links.register_handler(_KINDS, self)
        links.add_down_listener(self._on_down)

    def close(self) -> None:
        """Wait (bounded) for the ABORT replies still being sent; the links close after."""
        self._threads.join(ABORT_SEND_S + 1.0)

    def newest_epoch(self) -> tuple[int, int]:
        """The newest ``(policy_version, attempt)`` seen on the wire or started here."""
        with self._lock:
            seen = max(self._seen.items(), default=(-1, -1))
            return max(seen, (self._floor[0], self._floor[1]))

    def newest_attempt(self, version: int) -> int:
        """The newest attempt of ``version`` a neighbour has sent (-1 if none)."""
        with self._lock:
            return self._seen.get(version, -1)

    def allreduce(
        self,
        grad: Any,
        samples: int,
        *,
        step: int,
        policy: SyncPolicy,
        attempt: int = 0,
        timeout: float | None = None,
        out: Any = None,
        lossy: int | None = None,
        lane: int = 0,
        feed: InputFeed | None = None,
    ) -> ReduceResult:
        """Average ``grad`` over the policy's members, weighted by sample counts; commit.

        Args:
            grad: Flat float32 buffer (numpy array or CPU torch tensor); it is not modified,
                so an aborted step can be rerun with the same input.
            samples: Samples this node's gradient was computed from (>= 0).
            step: Global training step.
            policy: The sync policy.
            attempt: Rerun counter within ``policy.version``; ``(version, attempt, step)``
                must be newer than the tag of every phase run before on this node.
            timeout: Seconds before the round aborts (default: the constructor's).
            out: Optional destination of the result: a contiguous, writable float32 buffer
                with as many elements as ``grad`` and not overlapping it. Reusing one saves
                the kernel zeroing a fresh buffer's pages every round; it is overwritten even
                if the round aborts, so it must not hold a result still needed (an uncertain
                one, say).
            lossy: How many leading elements may travel in ``policy.wire``'s format (the
                gradients); the rest travel exact as float32. Default: all of them. With
                ``int8`` the node's error feedback is staged and applied only when this
                round's result is (it commits here, or a later :meth:`agree` applies it).
            lane: Which part of the caller's state the lossy values are (a streaming
                DiLoCo round's fragment): each lane keeps its own int8 error feedback.
            feed: The input is still being written (:class:`InputFeed`): each chunk is
                reduced once the feed covers it. The caller must not change a value the
                feed already covers until the round ends.

        Returns:
            The averaged values (a flat view of ``out``, else a new buffer) and the global
            sample count; the round has committed, so the caller must apply it. Every member
            holds bit-identical values, in every wire format.

        Raises:
            RoundAborted: Timeout, lost link, newer epoch or a neighbour's abort; ``result``
                is set when this node is uncertain (see the module docstring).
            DataPlaneError: Bad arguments, or a tag that is not newer than the last phase's.
        """
        inp, to_torch = as_flat_float32(grad)
        if samples < 0 or step < 0:
            raise DataPlaneError("samples and step must be >= 0")
        if lossy is not None and not 0 <= lossy <= inp.size:
            raise DataPlaneError(f"lossy must be in [0, {inp.size}], not {lossy}")
        out = np.empty_like(inp) if out is None else as_out_buffer(out, inp)
        tag = (policy.version, attempt, step)
        self._use_lane(lane)
        plan = self._plans.get(policy.wire, inp.size, inp.size if lossy is None else lossy,
                               policy.chunk_kib)
        parent, children = policy.parent(self.node_id), policy.children(self.node_id)
        wire = RoundWire(plan, out, parent, children, self.ring, self._pool,
                         self._feedback.for_plan(plan), tag)
        rnd = Round(tag, parent, children, wire, self._cond)
        if feed is not None:
            rnd.feed = feed
            feed.bind(self._cond, functools.partial(self._pump, rnd))
        try:
            self._execute(rnd, functools.partial(self._run_round, rnd, inp, samples), timeout)
        finally:
            if feed is not None:
                feed.bind(self._cond, None)
        if rnd.aborted:
            held = None
            if rnd.complete:  # uncertain: the next agreement applies or drops it (and the
                held = to_torch(out) if to_torch else out  # residual it staged)
            else:
                self._feedback.discard()
            raise RoundAborted(step, policy.version, rnd.abort_reason or "", rnd.abort_peer, held)
        assert rnd.total is not None
        self._feedback.commit(tag)
        return ReduceResult(to_torch(out) if to_torch else out, rnd.total, step, policy.version)

    def agree(
        self,
        *,
        policy: SyncPolicy,
        committed: int,
        holds: bool,
        attempt: int = 0,
        timeout: float | None = None,
        digest: bytes = b"",
    ) -> Decision:
        """Open the epoch ``(policy.version, attempt)``: agree on the last committed step.

        Args:
            policy: The epoch's sync policy.
            committed: This node's last committed step.
            holds: Whether this node holds the uncommitted result of round ``committed + 1``.
            attempt: The epoch's attempt.
            timeout: Seconds before the agreement aborts.
            digest: SHA-256 (32 bytes) of this node's complete state at ``committed``, for
                the divergence guard; b"" keeps this node out of the comparison.

        Returns:
            The decision; apply the held result if ``decision.step == committed + 1``, drop
            it if ``decision.step == committed``. If ``decision.step == committed`` and this
            node gave a digest other than ``decision.digest``, its state has diverged from
            the majority's (``agree.decide`` says how a tie is broken). The int8 error
            feedback staged by the round whose result this node holds is committed when the
            decision applies that result, and discarded otherwise.

        Raises:
            RoundAborted: As for :meth:`allreduce` (``step`` is ``committed``).
            DataPlaneError: A digest that is neither empty nor 32 bytes.
        """
        try:
            own = Summary.of(committed, holds, bytes(digest))
        except ValueError as exc:
            raise DataPlaneError(str(exc)) from None
        ag = Agreement((policy.version, attempt, -1), policy.parent(self.node_id),
                       policy.children(self.node_id), self._cond, committed + 1)
        self._execute(ag, functools.partial(self._run_agreement, ag, own), timeout)
        if ag.aborted or ag.decision is None:
            raise RoundAborted(committed, policy.version, ag.abort_reason or "", ag.abort_peer)
        if holds and ag.decision.step == committed + 1:
            self._feedback.commit(self._feedback.staged)  # the held result is applied
        else:
            self._feedback.discard()
        return ag.decision

    def supersede(self, version: int, from_step: int) -> tuple[str, ...]:
        """Policy ``version`` governs every round from ``from_step`` on (thread-safe).

        A phase of an older version for such a round cannot commit usefully (after a failure
        it waits for a peer that is gone), so it aborts now, and so does any such phase
        started later: the caller reruns the round under the newer policy at once instead of
        waiting for the round's timeout.

        Returns:
            The tree neighbours of the phase this aborted (empty if it aborted none).
        """
        with self._lock:
            self._fences.add(version, from_step)
            ph = self._phase
            if ph is None or ph.aborted or ph.done or self._fences.over(ph) is None:
                return ()
            ph.abort(f"superseded by policy v{version} (effective at step {from_step})")
            return ph.neighbours

    def interrupt_for(self, peer: str, version: int, reason: str) -> bool:
        """Abort the phase in flight if it waits on ``peer`` under policy ``version`` or a
        newer one (thread-safe): a new node whose replicate command came after the round
        began cannot take part before we serve it, which we do only between rounds.

        Returns:
            Whether a phase was aborted.
        """
        with self._lock:
            ph = self._phase
            if ph is None or ph.aborted or ph.done or ph.version < version \
                    or peer not in ph.neighbours:
                return False
            ph.abort(reason)
            return True

    # -- phase lifecycle -------------------------------------------------------------------
    def _execute(self, ph: Phase, body: Callable[[float], None], timeout: float | None) -> None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._lock:
            if self._phase is not None:
                raise DataPlaneError("another all-reduce phase is running on this node")
            if ph.tag <= self._floor:
                raise DataPlaneError(
                    f"tag {ph.tag} is not newer than the last one {self._floor}; "
                    "rerun under a newer policy version or attempt"
                )
            self._phase, self._floor = ph, ph.tag
            ph.deadline = deadline
            due, old = self._early.release(ph.tag)
            for peer, h, _ in old:
                self._drop_stale(peer, h, ph.tag)
            for peer, h, payload in due:  # before any reader's later frame of this phase
                self._replay(ph, peer, h, payload)
            fence = self._fences.over(ph)
            if fence is not None:  # the caller had not taken in the newer policy yet
                ph.abort(f"superseded by policy v{fence[0]} (effective at step {fence[1]})")
            self._cond.notify_all()  # wake readers holding frames of this phase
        try:
            if not ph.aborted:
                self._await_links(ph, deadline)
                body(deadline)
        except PeerGone as exc:
            with self._lock:
                ph.abort(f"link to {exc.peer_id} lost: {exc.reason}", exc.peer_id)
        finally:
            with self._lock:
                self._phase = None
                self._lost = ph.aborted
                self._cond.notify_all()
        if ph.aborted:
            self._propagate_abort(ph)
            log.warning("phase %s aborted: %s", ph.tag, ph.abort_reason)

    def _await_links(self, ph: Phase, deadline: float) -> None:
        missing = [p for p in ph.neighbours if self.links.state(p) != "up"]
        for peer in missing:
            if self.links.state(peer) == "down":
                raise PeerGone(peer, "link is down")
        # In slices, so that an abort (a newer policy) ends the wait too.
        while missing and not ph.aborted:
            left = deadline - time.monotonic()
            if left <= 0:
                raise PeerGone(missing[0], "no link at round start")
            if self.links.wait_connected(missing, min(left, 0.1)):
                return

