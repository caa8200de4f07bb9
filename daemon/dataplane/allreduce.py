"""Synchronous, chunked and pipelined tree all-reduce over PeerLinks.

Each node scales its gradient by its local sample count; partial sums flow towards the root
chunk by chunk (a node forwards chunk i as soon as all its children delivered chunk i), the
root divides each chunk by the global sample count and immediately broadcasts it back down,
and every node forwards broadcast chunks to its children as they arrive. Only the root computes
the final values, so every node ends with bit-identical results.

Every frame is tagged ``(policy_version, step)``. Frames with an older tag are drained and
dropped; frames with a newer tag are held (their reader waits, which back-pressures the sender
through TCP) until this node starts that round, and a newer policy version aborts the current
round. A timeout, a lost link, a protocol violation or a neighbour's ABORT aborts the round;
the abort is forwarded to the other tree neighbours so nobody waits for a dead round, and the
caller gets :class:`RoundAborted`.
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

from daemon.dataplane.errors import DataPlaneError, PeerGone, RoundAborted
from daemon.dataplane.frames import MAX_PAYLOAD, FrameHeader, Kind
from daemon.dataplane.links import PeerLinks
from daemon.dataplane.policy import SyncPolicy
from daemon.dataplane.rounds import MAX_REASON, Round, as_flat_float32

log = logging.getLogger("chaos.dataplane.allreduce")
#: Test seam: called as ``hook(event, chunk)`` after each chunk is sent ("reduce"/"bcast").
FaultHook = Callable[[str, int], None]
_KINDS = (Kind.COUNT, Kind.TOTAL, Kind.REDUCE, Kind.BCAST, Kind.ABORT)
_ABORT_SEND_S = 2.0


@dataclass(frozen=True)
class ReduceResult:
    """Outcome of a successful round.

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
    """Runs all-reduce rounds for one node over its PeerLinks.

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
        self._hook = fault_hook
        self._cond = threading.Condition()
        self._round: Round | None = None
        self._floor: tuple[int, int] = (-1, -1)  # tag of the last round started here
        links.register_handler(_KINDS, self)
        links.add_down_listener(self._on_down)

    def allreduce(
        self,
        grad: Any,
        samples: int,
        *,
        step: int,
        policy: SyncPolicy,
        timeout: float | None = None,
    ) -> ReduceResult:
        """Average ``grad`` over the policy's members, weighted by sample counts.

        Args:
            grad: Flat float32 buffer (numpy array or CPU torch tensor); it is not modified,
                so an aborted step can be rerun with the same input.
            samples: Samples this node's gradient was computed from (>= 0).
            step: Global training step.
            policy: The sync policy; ``(policy.version, step)`` must be newer than the tag
                of every round run before on this node.
            timeout: Seconds before the round aborts (default: the constructor's).

        Returns:
            The averaged values (a new buffer) and the global sample count.

        Raises:
            RoundAborted: Timeout, lost link, version mismatch or a neighbour's abort.
            DataPlaneError: Bad arguments, or a tag that is not newer than the last round's.
        """
        inp, to_torch = as_flat_float32(grad)
        if samples < 0 or step < 0:
            raise DataPlaneError("samples and step must be >= 0")
        tag = (policy.version, step)
        out = np.empty_like(inp)
        rnd = Round(
            tag,
            policy.parent(self.node_id),
            policy.children(self.node_id),
            out,
            self.chunk_elems,
            self.ring,
            self._cond,
        )
        deadline = time.monotonic() + (self.timeout if timeout is None else timeout)
        with self._cond:
            if self._round is not None:
                raise DataPlaneError("another all-reduce round is running on this node")
            if tag <= self._floor:
                raise DataPlaneError(
                    f"round tag (v{tag[0]}, step {tag[1]}) is not newer than the last one "
                    f"(v{self._floor[0]}, step {self._floor[1]}); rerun under a new policy version"
                )
            self._round, self._floor = rnd, tag
            self._cond.notify_all()  # wake readers holding frames of this round
        try:
            self._run(rnd, inp, samples, deadline)
        except PeerGone as exc:
            with self._cond:
                rnd.abort(f"link to {exc.peer_id} lost: {exc.reason}", exc.peer_id)
        finally:
            with self._cond:
                self._round = None
                self._cond.notify_all()
        if rnd.abort_reason is not None:
            self._propagate_abort(rnd)
            log.warning("round v%d step %d aborted: %s", tag[0], step, rnd.abort_reason)
            raise RoundAborted(step, policy.version, rnd.abort_reason, rnd.abort_peer)
        assert rnd.total is not None
        values = to_torch(out) if to_torch else out
        return ReduceResult(values, rnd.total, step, policy.version)

    # -- round thread ----------------------------------------------------------------------
    def _run(self, r: Round, inp: np.ndarray, samples: int, deadline: float) -> None:
        missing = [p for p in r.neighbours if self.links.state(p) != "up"]
        for peer in missing:
            if self.links.state(peer) == "down":
                raise PeerGone(peer, "link is down")
        if missing and not self.links.wait_connected(missing, deadline - time.monotonic()):
            raise PeerGone(missing[0], "no link at round start")
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
                return

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

    def _wait(self, r: Round, deadline: float, ready: Callable[[], bool]) -> bool:
        with self._cond:
            return self._wait_locked(r, deadline, ready)

    def _wait_locked(self, r: Round, deadline: float, ready: Callable[[], bool]) -> bool:
        """Wait for ``ready()``; False (with the round aborted) on abort or timeout."""
        while not r.aborted and not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                r.abort(f"timed out after waiting for neighbours {list(r.neighbours)}")
                break
            self._cond.wait(min(left, 0.5))
        return not r.aborted

    def _send(
        self,
        r: Round,
        peer: str,
        kind: Kind,
        chunk: int,
        payload: bytes | memoryview,
        deadline: float,
    ) -> None:
        aux = r.out.size if kind in (Kind.REDUCE, Kind.BCAST) else 0
        header = FrameHeader(kind, r.step, r.version, aux, chunk, len(payload))
        self.links.send(peer, header, payload, deadline)

    def _fire(self, event: str, chunk: int) -> None:
        if self._hook is not None:
            self._hook(event, chunk)

    def _propagate_abort(self, r: Round) -> None:
        reason = (r.abort_reason or "aborted").encode()[:MAX_REASON]
        deadline = time.monotonic() + _ABORT_SEND_S
        for peer in r.neighbours:
            if r.abort_from_frame and peer == r.abort_peer:
                continue
            with contextlib.suppress(PeerGone):  # that neighbour then sees the link drop
                self._send(r, peer, Kind.ABORT, 0, reason, deadline)

    # -- FrameHandler (reader threads) -----------------------------------------------------
    def buffer_for(
        self, peer: str, header: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        """Route a frame by its tag: stale -> drop, current -> round, newer -> hold."""
        tag = header.tag
        with self._cond:
            while True:
                r = self._round
                current = r.tag if r is not None else self._floor
                if tag < current or (tag == current and r is None):
                    return None
                if r is not None and tag == current:
                    return r.claim(peer, header, is_open)
                if r is not None and header.policy_version > r.version and not r.aborted:
                    r.abort(f"policy version mismatch: {peer} is at v{header.policy_version}", peer)
                if not is_open():
                    return None
                self._cond.wait(0.25)

    def on_frame(self, peer: str, header: FrameHeader, payload: memoryview) -> None:
        """Account for a delivered payload."""
        with self._cond:
            r = self._round
            if r is not None and header.tag == r.tag:
                r.delivered(peer, header, payload)

    def _on_down(self, peer: str, reason: str) -> None:
        with self._cond:
            r = self._round
            if r is not None and peer in r.neighbours:
                r.abort(f"link to {peer} lost: {reason}", peer)
