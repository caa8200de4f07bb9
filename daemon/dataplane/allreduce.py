"""Synchronous, chunked, pipelined tree all-reduce with an atomic commit over PeerLinks.

**Data flow.** Each node scales its gradient by its local sample count; partial sums flow
towards the root chunk by chunk, the root divides each chunk by the global sample count and
broadcasts it back down, and every node forwards broadcast chunks to its children as they
arrive. Only the root computes the final values, so every holder has bit-identical results.

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
(3) If no survivor committed ``s``, the agreement sees everyone at ``s - 1`` and they all
drop what they hold, consistently (what a dead node applied does not matter). (4) A round
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

import contextlib
import functools
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from daemon.contracts.policy import SyncPolicy
from daemon.dataplane.agree import Agreement, Decision, Summary, decide
from daemon.dataplane.early import EarlyFrames
from daemon.dataplane.errors import DataPlaneError, PeerGone, RoundAborted
from daemon.dataplane.fences import Fences
from daemon.dataplane.frames import MAX_PAYLOAD, FrameHeader, Kind, phase_flags
from daemon.dataplane.links import PeerLinks
from daemon.dataplane.rounds import MAX_REASON, Phase, Round, Tag, as_flat_float32, as_out_buffer
from daemon.dataplane.threads import ThreadSet

log = logging.getLogger("chaos.dataplane.allreduce")
#: Test seam: ``hook(event, index)`` after each send: "reduce"/"bcast" (chunk), "ack",
#: "commit" (child index), "agree-up", "agree-down" (child index).
FaultHook = Callable[[str, int], None]
_KINDS = (Kind.COUNT, Kind.TOTAL, Kind.REDUCE, Kind.BCAST, Kind.ABORT, Kind.ACK, Kind.COMMIT,
          Kind.AGREE_UP, Kind.AGREE_DOWN)  # fmt: skip
_ABORT_SEND_S = 2.0


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


class AllReducer:
    """Runs all-reduce rounds and agreements for one node over its PeerLinks.

    Args:
        links: This node's started PeerLinks.
        chunk_bytes: Pipeline chunk size (a multiple of 4, at most MAX_PAYLOAD).
        ring: Receive slots per child; memory is ``ring * chunk_bytes`` per child.
        timeout: Default seconds a round may take before it aborts.
        fault_hook: Test seam, see FaultHook.
    """

    def __init__(
        self,
        links: PeerLinks,
        *,
        chunk_bytes: int = 1 << 20,
        ring: int = 4,
        timeout: float = 30.0,
        fault_hook: FaultHook | None = None,
    ) -> None:
        if chunk_bytes % 4 or not 0 < chunk_bytes <= MAX_PAYLOAD or ring < 1:
            raise ValueError("chunk_bytes must be a multiple of 4 in (0, MAX_PAYLOAD]; ring >= 1")
        self.links, self.node_id = links, links.me.node_id
        self.chunk_elems, self.ring, self.timeout = chunk_bytes // 4, ring, timeout
        self.fault_hook = fault_hook
        self._cond = threading.Condition()
        self._phase: Phase | None = None
        self._floor: Tag = (-1, -1, -1)  # tag of the last phase started here
        self._seen: dict[int, int] = {}  # policy version -> newest attempt seen on the wire
        self._told: set[tuple[str, Tag]] = set()  # stale phases we answered with an ABORT
        self._lost = False  # whether the last phase run here (the floor) aborted
        self._early = EarlyFrames()  # control frames of phases not opened yet
        self._fences = Fences()  # newer policies: phases they make pointless abort at once
        self._threads = ThreadSet()  # ABORT replies to stale phases, joined on close
        links.register_handler(_KINDS, self)
        links.add_down_listener(self._on_down)

    def close(self) -> None:
        """Wait (bounded) for the ABORT replies still being sent; the links close after."""
        self._threads.join(_ABORT_SEND_S + 1.0)

    def newest_epoch(self) -> tuple[int, int]:
        """The newest ``(policy_version, attempt)`` seen on the wire or started here."""
        with self._cond:
            seen = max(self._seen.items(), default=(-1, -1))
            return max(seen, (self._floor[0], self._floor[1]))

    def newest_attempt(self, version: int) -> int:
        """The newest attempt of ``version`` a neighbour has sent (-1 if none)."""
        with self._cond:
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

        Returns:
            The averaged values (a flat view of ``out``, else a new buffer) and the global
            sample count; the round has committed, so the caller must apply it.

        Raises:
            RoundAborted: Timeout, lost link, newer epoch or a neighbour's abort; ``result``
                is set when this node is uncertain (see the module docstring).
            DataPlaneError: Bad arguments, or a tag that is not newer than the last phase's.
        """
        inp, to_torch = as_flat_float32(grad)
        if samples < 0 or step < 0:
            raise DataPlaneError("samples and step must be >= 0")
        out = np.empty_like(inp) if out is None else as_out_buffer(out, inp)
        rnd = Round((policy.version, attempt, step), policy.parent(self.node_id),
                    policy.children(self.node_id), out, self.chunk_elems, self.ring, self._cond)
        self._execute(rnd, functools.partial(self._run_round, rnd, inp, samples), timeout)
        if rnd.aborted:
            held = None
            if rnd.complete:
                held = to_torch(out) if to_torch else out
            raise RoundAborted(step, policy.version, rnd.abort_reason or "", rnd.abort_peer, held)
        assert rnd.total is not None
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
            the majority's (``agree.decide`` says how a tie is broken).

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
        with self._cond:
            self._fences.add(version, from_step)
            ph = self._phase
            if ph is None or ph.aborted or ph.done or self._fences.over(ph) is None:
                return ()
            ph.abort(f"superseded by policy v{version} (effective at step {from_step})")
            return ph.neighbours

    # -- phase lifecycle -------------------------------------------------------------------
    def _execute(self, ph: Phase, body: Callable[[float], None], timeout: float | None) -> None:
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            if self._phase is not None:
                raise DataPlaneError("another all-reduce phase is running on this node")
            if ph.tag <= self._floor:
                raise DataPlaneError(
                    f"tag {ph.tag} is not newer than the last one {self._floor}; "
                    "rerun under a newer policy version or attempt"
                )
            self._phase, self._floor = ph, ph.tag
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
            with self._cond:
                ph.abort(f"link to {exc.peer_id} lost: {exc.reason}", exc.peer_id)
        finally:
            with self._cond:
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
        with self._cond:
            ag.done = True  # the decision is known here; a child that misses it re-agrees
        for i, c in enumerate(ag.children):
            with contextlib.suppress(PeerGone):
                self._send(ag, c, Kind.AGREE_DOWN, 0, ag.decision.pack(), deadline)
            self._fire("agree-down", i)

    # -- round -----------------------------------------------------------------------------
    def _run_round(self, r: Round, inp: np.ndarray, samples: int, deadline: float) -> None:
        if not self._wait(r, deadline, lambda: all(s.count is not None for s in r.child.values())):
            return
        subtree = samples + sum(s.count or 0 for s in r.child.values())
        if r.parent is not None:
            self._send(r, r.parent, Kind.COUNT, 0, subtree.to_bytes(8, "big"), deadline)
        else:
            r.total = subtree
        n32 = np.float32(samples)
        red = fwd = 0
        total_sent = False
        while True:
            with self._cond:
                ready = self._wait_locked(
                    r, deadline, functools.partial(self._progress, r, red, fwd, total_sent)
                )
                if not ready:
                    return
                up_to = min((s.received for s in r.child.values()), default=r.nchunks)
                down_to = red if r.parent is None else r.bcast_received
                total = r.total
                if r.parent is not None and r.bcast_received == r.nchunks and total is not None:
                    r.complete = True  # we hold the whole result: uncertain from here on
            if total is not None and not total_sent:
                for c in r.children:
                    self._send(r, c, Kind.TOTAL, 0, total.to_bytes(8, "big"), deadline)
                total_sent = True
            if red < min(up_to, r.nchunks):
                self._reduce_chunk(r, inp, n32, red)
                red += 1
                if r.parent is not None:
                    lo, hi = r.bounds(red - 1)
                    self._send(
                        r, r.parent, Kind.REDUCE, red - 1, r.out_bytes[lo * 4 : hi * 4], deadline
                    )
                    self._fire("reduce", red - 1)
                down_to = red if r.parent is None else down_to
            while fwd < down_to:
                lo, hi = r.bounds(fwd)
                for c in r.children:
                    self._send(r, c, Kind.BCAST, fwd, r.out_bytes[lo * 4 : hi * 4], deadline)
                fwd += 1
                self._fire("bcast", fwd - 1)
            if red == fwd == r.nchunks and total_sent:
                break
        self._commit(r, deadline)

    def _commit(self, r: Round, deadline: float) -> None:
        with self._cond:
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
        with self._cond:
            r.done = True  # committed: nothing after this point can turn into an abort
        for i, c in enumerate(r.children):
            with contextlib.suppress(PeerGone):  # that child is uncertain and will re-agree
                self._send(r, c, Kind.COMMIT, 0, b"", deadline)
            self._fire("commit", i)

    def _progress(self, r: Round, red: int, fwd: int, total_sent: bool) -> bool:
        """Whether the round thread has work (called with the condition held)."""
        if not total_sent and r.total is not None:
            return True
        up_to = min((s.received for s in r.child.values()), default=r.nchunks)
        down_to = red if r.parent is None else r.bcast_received
        done = red == fwd == r.nchunks and total_sent
        return red < min(up_to, r.nchunks) or fwd < down_to or done

    def _reduce_chunk(self, r: Round, inp: np.ndarray, n32: np.float32, i: int) -> None:
        lo, hi = r.bounds(i)
        acc = r.out[lo:hi]
        np.multiply(inp[lo:hi], n32, out=acc)
        for c in r.children:  # fixed order: the root's sums are reproducible
            np.add(acc, r.child[c].slots[i % r.ring, : hi - lo], out=acc)
        with self._cond:
            for state in r.child.values():
                state.consumed += 1
            self._cond.notify_all()
        if r.parent is None:
            np.divide(acc, np.float32(max(r.total or 0, 1)), out=acc)

    # -- helpers ---------------------------------------------------------------------------
    def _wait(self, ph: Phase, deadline: float, ready: Callable[[], bool]) -> bool:
        with self._cond:
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
        header = FrameHeader(kind, max(ph.step, 0), ph.version, aux, chunk, len(payload), flags)
        self.links.send(peer, header, payload, deadline)

    def _fire(self, event: str, index: int) -> None:
        if self.fault_hook is not None:
            self.fault_hook(event, index)

    def _propagate_abort(self, ph: Phase) -> None:
        reason = (ph.abort_reason or "aborted").encode()[:MAX_REASON]
        deadline = time.monotonic() + _ABORT_SEND_S
        for peer in ph.neighbours:
            if ph.abort_from_frame and peer == ph.abort_peer:
                continue
            with contextlib.suppress(PeerGone):  # that neighbour then sees the link drop
                self._send(ph, peer, Kind.ABORT, 0, reason, deadline)

    # -- FrameHandler (reader threads) -----------------------------------------------------
    def buffer_for(
        self, peer: str, header: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        """Route a frame by its tag: stale -> drop, current -> phase, newer -> hold."""
        tag = header.round_tag
        with self._cond:
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
                if ph is not None and header.epoch > ph.epoch and not ph.aborted:
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
                self.links.send(peer, reply, reason, time.monotonic() + _ABORT_SEND_S)

        self._threads.start(send, f"stale-{peer}")

    def on_frame(self, peer: str, header: FrameHeader, payload: memoryview) -> None:
        """Account for a delivered payload."""
        with self._cond:
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
            if ph is not None and header.round_tag == ph.tag:
                ph.delivered(peer, header, payload)

    def _replay(self, ph: Phase, peer: str, header: FrameHeader, payload: bytes) -> None:
        """Deliver an early control frame to its phase as if it arrived now."""
        dest = ph.claim(peer, header, lambda: True)  # control frames never wait for a slot
        if dest is not None:
            dest[:] = payload
            ph.delivered(peer, header, dest)

    def _on_down(self, peer: str, reason: str) -> None:
        with self._cond:
            self._early.forget(peer)
            ph = self._phase
            if ph is not None and peer in ph.neighbours:
                ph.abort(f"link to {peer} lost: {reason}", peer)
