"""The chunk arithmetic of one round in the policy's wire format, and the buffers it reuses.

A :class:`RoundWire` is what a :class:`~chaos_edge.dataplane.rounds.Round` asks where a child's
partial sum lands, how the next chunk is reduced and what bytes go out, and where a broadcast
chunk lands. With fp32 (``WirePlan.identity``) it is the raw float32 path: slots are read as
float32, the root sends views of its output, a BCAST chunk lands straight in ``out``. With a
lossy format (see :mod:`chaos_edge.dataplane.codec`):

- a node adds each child's chunk into its partial sum with ``plan.decode_add`` and sends
  ``plan.encode`` of the sum up (int8: with this node's upward error feedback);
- the root divides, encodes the final chunk once into its *down* buffer (int8: with its own
  feedback) and decodes those very bytes into ``out``, so it holds what every member gets;
- a relay or leaf receives BCAST bytes into its down buffer, forwards them unchanged and
  decodes them into ``out``.

Every member therefore decodes the same bytes with the same exact arithmetic: bit-identical
results, as the commit protocol needs. Only the lossy prefix (``lossy`` leading elements, the
gradients) is compressed; the tail travels as exact float32.

Error feedback (int8 only, as chaosd.toml(5) says) is *staged* under the round's tag while the
round encodes and becomes the residual only through :meth:`Feedback.commit`, which the
AllReducer calls when the result is applied (the round committed, or an agreement applies the
result an uncertain node held); an abort or a dropped result discards it, so a rerun round
adds back exactly the residual of the last applied round.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Hashable

import numpy as np

from chaos_edge.dataplane.codec import codec_for
from chaos_edge.dataplane.wireplan import ErrorFeedback, WirePlan

log = logging.getLogger("chaos.dataplane.allreduce")
#: The automatic chunk size (``AllReducer(chunk_bytes=None)``, the Trainer's default): about
#: AUTO_CHUNKS chunks per round, a multiple of 64 KiB between AUTO_MIN and AUTO_MAX bytes.
#: Enough chunks keep every hop of the tree busy at once (the pipeline); larger ones cost
#: fewer wakeups and calls per byte, which is what bounds a CPU-bound box (BENCHMARKS.md).
AUTO_CHUNKS = 12
AUTO_MIN, AUTO_MAX = 1 << 20, 16 << 20


def auto_chunk_elems(size: int) -> int:
    """Elements per chunk of an automatically chunked round of ``size`` float32 values (the
    same on every member: it depends on the vector's size only)."""
    step = 64 << 10
    per_chunk = math.ceil(4 * size / AUTO_CHUNKS)
    return min(AUTO_MAX, max(AUTO_MIN, math.ceil(per_chunk / step) * step)) // 4

def _ring(store: dict[str, np.ndarray], key: str, rows: int, nbytes: int) -> np.ndarray:
    """A ``(rows, >= nbytes)`` uint8 array kept in ``store`` across rounds (pages stay
    faulted in); reallocated only when the shape no longer fits."""
    width = -(-nbytes // 8) * 8
    buf = store.get(key)
    if buf is None or buf.shape[0] != rows or buf.shape[1] < width:
        buf = np.empty((rows, max(width, 8)), np.uint8)
        store[key] = buf
    return buf


class BufferPool:
    """Receive rings (one per child, written only by that child's reader thread) and the
    node's own scratch, reused by every round of one AllReducer."""

    def __init__(self) -> None:
        self.children: dict[str, np.ndarray] = {}
        self.own: dict[str, np.ndarray] = {}

    def child_ring(self, child: str, rows: int, nbytes: int) -> np.ndarray:
        return _ring(self.children, child, rows, nbytes)

    def keep_children(self, children: tuple[str, ...]) -> None:
        """Free the rings of former children (their readers no longer write there)."""
        for c in [c for c in self.children if c not in children]:
            del self.children[c]

    def own_buffer(self, name: str, rows: int, nbytes: int) -> np.ndarray:
        return _ring(self.own, name, rows, nbytes)


class Feedback:
    """This node's int8 error-feedback residuals: one for the partial sums it sends up, one
    for the final chunks it encodes as the root (their units differ). Rebuilt, at zero, when
    the format or the lossy prefix changes, and dropped by a round in another format: kept
    through fp32 rounds (the policy controller switches the wire mid-run), a residual would be
    added back to a gradient long after the round that lost it."""

    def __init__(self) -> None:
        self._key: tuple[str, int] | None = None
        self.up: ErrorFeedback | None = None
        self.root: ErrorFeedback | None = None

    def for_plan(self, plan: WirePlan) -> tuple[ErrorFeedback | None, ErrorFeedback | None]:
        """``(up, root)`` residuals for a round under ``plan``; both None without feedback."""
        if plan.identity or plan.codec.name != "int8":
            self._key, self.up, self.root = None, None, None
            return None, None
        key = (plan.codec.name, plan.lossy)
        if key != self._key:
            self._key = key
            self.up = ErrorFeedback(plan.codec, plan.lossy)
            self.root = ErrorFeedback(plan.codec, plan.lossy)
        return self.up, self.root

    @property
    def staged(self) -> Hashable:
        """The tag of the round whose residual is staged (None when nothing is)."""
        for fb in (self.up, self.root):
            if fb is not None and fb.staged is not None:
                return fb.staged
        return None

    def commit(self, tag: Hashable) -> None:
        """The round ``tag``'s result was applied: its staged residuals become current."""
        for fb in (self.up, self.root):
            if fb is not None:
                fb.commit(tag)

    def discard(self) -> None:
        """The staged round's result will never be applied here."""
        for fb in (self.up, self.root):
            if fb is not None:
                fb.discard()


class Plans:
    """The WirePlan of the last round shape (the Trainer's never changes).

    Args:
        chunk_elems: Elements per chunk, or None for :func:`auto_chunk_elems`.
    """

    def __init__(self, chunk_elems: int | None) -> None:
        self.chunk_elems = chunk_elems
        self._key: tuple[str, int, int, int] | None = None
        self._plan: WirePlan | None = None

    def get(self, wire: str, size: int, lossy: int, policy_kib: int = 0) -> WirePlan:
        """The plan of a round (``policy_kib``: the policy's chunk size, which a size set
        for this reducer overrides; 0: sized by the vector)."""
        key = (wire, size, lossy, policy_kib)
        if self._plan is None or key != self._key:
            chunk = self.chunk_elems or (policy_kib * 256 if policy_kib else
                                         auto_chunk_elems(size))
            codec = codec_for(wire)
            codec.warm()  # before the round's clock starts
            self._plan = WirePlan(codec, size, lossy, chunk)
            if self._key is None or self._key[0] != wire:
                log.info("all-reduce rounds travel as %s (%d of %d values in that format)",
                         wire, self._plan.lossy, size)
            self._key = key
        return self._plan


class RoundWire:
    """One round's chunk arithmetic and buffers (see the module docstring).

    Args:
        plan: The round's wire plan.
        out: The output buffer (float32, 1-D).
        parent: Parent in the tree (None at the root).
        children: Children, in the fixed order their sums are added.
        ring: Receive slots per child, and encoded partial sums in flight upwards.
        pool: The AllReducer's reused buffers.
        feedback: ``(up, root)`` residuals, or ``(None, None)``.
        tag: The round's tag, under which feedback is staged.
    """

    def __init__(
        self, plan: WirePlan, out: np.ndarray, parent: str | None, children: tuple[str, ...],
        ring: int, pool: BufferPool,
        feedback: tuple[ErrorFeedback | None, ErrorFeedback | None], tag: Hashable,
    ) -> None:  # fmt: skip
        self.plan, self.out, self.ring, self.tag = plan, out, ring, tag
        self.is_root, self.children = parent is None, children
        self.identity = plan.identity
        self.fb_up, self.fb_root = feedback
        self.out_bytes = out.data.cast("B")
        slot = plan.slot_bytes
        pool.keep_children(children)
        self.slots = {c: pool.child_ring(c, ring, slot) for c in children}
        # Partial sums of an inner node (float32, cache-sized unlike out).
        self.scratch = pool.own_buffer("scratch", ring, 4 * plan.chunk_elems)
        self.up_ring = self.down = None
        if not self.identity:
            self.up_ring = pool.own_buffer("up", ring, slot)  # encoded partial sums
            self.down = pool.own_buffer("down", 1, plan.total_bytes)[0]  # encoded results

    def sends_input(self, samples: int) -> bool:
        """Whether chunks go up as views of the input itself (an fp32 leaf of one sample:
        ``x * 1 == x``), so no scratch slot bounds how many are in flight."""
        return self.identity and not self.children and samples == 1 and not self.is_root

    def child_slot(self, child: str, i: int) -> np.ndarray:
        """Where chunk ``i`` of a child's partial sum lands (its exact wire size)."""
        return self.slots[child][i % self.ring, : self.plan.chunk_bytes(i)]

    def bcast_dest(self, i: int) -> memoryview:
        """Where BCAST chunk ``i`` lands: ``out`` itself for fp32, else the down buffer."""
        if self.down is None:
            lo, hi = self.plan.bounds(i)
            return self.out_bytes[lo * 4 : hi * 4]
        return self._down(i).data

    def _down(self, i: int) -> np.ndarray:
        assert self.down is not None
        at = self.plan.offset(i)
        return self.down[at : at + self.plan.chunk_bytes(i)]

    def bcast_decode(self, i: int) -> None:
        """Decode landed BCAST chunk ``i`` into ``out`` (nothing to do for fp32)."""
        if self.down is not None:
            lo, hi = self.plan.bounds(i)
            self.plan.decode(i, self._down(i), self.out[lo:hi])

    def reduce(self, inp: np.ndarray, samples: int, total: int | None, i: int) -> memoryview:
        """Chunk ``i`` of ``samples * inp`` plus the children's partial sums, in their fixed
        order (so the root's sums are reproducible); at the root divided by ``total`` and
        kept in ``out``. Returns the bytes to send (up, or down at the root); the
        children's slots of chunk ``i`` may be reused once this returns."""
        lo, hi = self.plan.bounds(i)
        own, k = inp[lo:hi], i % self.ring
        if self.sends_input(samples):
            return own.data.cast("B")
        acc = self.out[lo:hi] if self.is_root else self.scratch[k].view(np.float32)[: hi - lo]
        if self.identity:
            kids = [self.slots[c][k].view(np.float32)[: hi - lo] for c in self.children]
            if samples == 1 and kids:
                np.add(own, kids[0], out=acc)
                kids = kids[1:]
            elif samples == 1:
                np.copyto(acc, own)
            else:
                np.multiply(own, np.float32(samples), out=acc)
            for slot in kids:
                np.add(acc, slot, out=acc)
        else:
            if samples == 1:
                if not self.children and not self.is_root:
                    return self._up(i, own)  # encoded straight from the input
                np.copyto(acc, own)
            else:
                np.multiply(own, np.float32(samples), out=acc)
            for c in self.children:
                self.plan.decode_add(i, self.child_slot(c, i), acc)
        if not self.is_root:
            return acc.data.cast("B") if self.identity else self._up(i, acc)
        np.divide(acc, np.float32(max(total or 0, 1)), out=acc)
        if self.down is None:
            return self.out_bytes[lo * 4 : hi * 4]
        dst = self._down(i)
        # Encoded once; the root keeps what its members will decode from these bytes.
        self.plan.encode(i, acc, dst, feedback=self.fb_root, decoded=acc, tag=self.tag)
        return dst.data

    def _up(self, i: int, values: np.ndarray) -> memoryview:
        assert self.up_ring is not None
        dst = self.up_ring[i % self.ring, : self.plan.chunk_bytes(i)]
        self.plan.encode(i, values, dst, feedback=self.fb_up, tag=self.tag)
        return dst.data
