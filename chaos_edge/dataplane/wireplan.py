"""One round's vector on the wire (:class:`WirePlan`) and a node's error feedback
(:class:`ErrorFeedback`), over the codecs of :mod:`chaos_edge.dataplane.codec`, whose docstring
describes the formats and how the all-reduce uses these classes.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Hashable
from typing import Any

import numpy as np

from chaos_edge.dataplane.codec import _F32, PIECE, Codec, _floats, _scratch, _wire


class ErrorFeedback:
    """A node's residual over the lossy prefix: what its encodes lost, added back next round.

    A node sends ``encode(x + r)`` and keeps ``r' = (x + r) - decode(encode(x + r))``, so the
    sum of what it sent over rounds tracks the sum of its inputs within one residual (bounded
    by the format's error of one round). Staging and encoding are one call, :meth:`encode`,
    since the new residual needs the decoded bytes. The new residual is *staged* under the
    round's tag and becomes the residual only on :meth:`commit`: an aborted round is rerun
    with the same input, and must not consume the residual twice. Commit when the round's
    result is applied (it committed, or the agreement applies the result an uncertain node
    held); :meth:`discard` when it is not. Staging under a new tag drops what another tag
    staged, so a forgotten discard is harmless.

    The residual is in the units of what the node encodes: sample-weighted partial sums on
    the way up, the average at the root. Use one instance per role, or :meth:`reset` when the
    node becomes or stops being the root. Residuals are local, never replicated: a joining
    node starts at zero, and they are no part of the state the divergence guard digests.
    Elements where ``x + r`` or its decode is not finite (an overflow step) keep their old
    residual. Memory: two float32 buffers of ``size`` values, allocated on first use.

    Args:
        codec: The wire format.
        size: Length of the lossy prefix the residual covers.
    """

    def __init__(self, codec: Codec, size: int) -> None:
        if size < 0:
            raise ValueError("size must be >= 0")
        self.codec, self.size = codec, size
        self._res: np.ndarray | None = None
        self._pend: np.ndarray | None = None
        self._ranges: list[tuple[int, int]] = []
        self._tag: Hashable = None
        self._lock = threading.Lock()

    @property
    def residual(self) -> np.ndarray:
        """The committed residual (a read-only view; zeros before the first commit)."""
        view = (self._res if self._res is not None else np.zeros(self.size, np.float32)).view()
        view.flags.writeable = False
        return view

    @property
    def staged(self) -> Hashable:
        """The tag of the staged ranges, or None when nothing is staged."""
        return self._tag if self._ranges else None

    def encode(self, lo: int, hi: int, src: Any, dst: Any, decoded: Any = None,
               tag: Hashable = None) -> None:
        """Encode ``src`` (the values of ``[lo, hi)``) plus their residual into ``dst``.

        Args:
            lo: First element of the range within the lossy prefix.
            hi: End of the range (``hi - lo == len(src)``).
            src: The float32 values to send.
            dst: The wire bytes, ``codec.wire_bytes(hi - lo)`` of them.
            decoded: Optional float32 buffer that receives ``decode(dst)``, what every
                receiver gets (the root passes its output here); it may be ``src`` itself.
            tag: The round's tag, e.g. ``(policy_version, attempt, step)``.
        """
        if not 0 <= lo <= hi <= self.size:
            raise ValueError(f"range [{lo}, {hi}) outside the lossy prefix of {self.size}")
        x = _floats(src)
        n, codec = hi - lo, self.codec
        out = None if decoded is None else _floats(decoded)
        if x.size != n or (out is not None and out.size != n):
            raise ValueError(f"src and decoded must hold the {n} values of [{lo}, {hi})")
        w = _wire(dst, codec.wire_bytes(n))
        with self._lock:
            if self._res is None or self._pend is None:
                self._res = np.zeros(self.size, np.float32)
                self._pend = np.zeros(self.size, np.float32)
            if tag != self._tag:
                self._ranges, self._tag = [], tag
            res, pend = self._res[lo:hi], self._pend[lo:hi]
        with np.errstate(all="ignore"):
            for a in range(0, n, PIECE):  # piece by piece: each stays in cache for every pass
                b = min(a + PIECE, n)
                p, r = pend[a:b], res[a:b]
                np.add(x[a:b], r, out=p)  # before ``decoded`` (maybe ``src``) is overwritten
                codec._encode(p, w, n, a)
                d = _scratch(b - a, "feedback") if out is None else out[a:b]
                codec._decode(w, n, a, d, False)
                np.subtract(p, d, out=p)
                if not math.isfinite(p.sum()):  # rare: inf/nan (or a huge finite sum)
                    bad = ~np.isfinite(p)
                    p[bad] = r[bad]
        with self._lock:
            self._ranges.append((lo, hi))

    def commit(self, tag: Hashable = None) -> bool:
        """Make what ``tag`` staged the residual; False (and nothing staged) otherwise."""
        with self._lock:
            ranges, self._ranges = sorted(self._ranges), []
            if not ranges or tag != self._tag or self._res is None or self._pend is None:
                return False
            covered = 0
            for lo, hi in ranges:
                covered = max(covered, hi) if lo <= covered else -1
                if covered < 0:
                    break
            if covered == self.size:  # the usual case: the whole prefix, so swap
                self._res, self._pend = self._pend, self._res
            else:
                for lo, hi in ranges:
                    self._res[lo:hi] = self._pend[lo:hi]
            return True

    def discard(self) -> None:
        """Drop what is staged (the round aborted, or the agreement dropped its result)."""
        with self._lock:
            self._ranges, self._tag = [], None

    def reset(self) -> None:
        """Zero the residual and drop what is staged."""
        with self._lock:
            self._ranges, self._tag = [], None
            if self._res is not None:
                self._res.fill(0.0)


class WirePlan:
    """One round's vector on the wire: chunk by chunk, a lossy prefix, an exact fp32 tail.

    Chunk ``i`` covers elements ``[i * chunk_elems, ...)`` as in the all-reduce. Its wire
    bytes are the codec's encoding of its part of ``[0, lossy)``, zero padding to a multiple
    of 4, then its part of ``[lossy, size)`` as raw float32. With ``identity`` (fp32, or no
    lossy prefix) every chunk is its raw float32 bytes, and the pipeline can skip the codec.

    Args:
        codec: The policy's wire format.
        size: Elements in the round's vector.
        lossy: Leading elements that may be compressed (the gradients); the rest (buffers,
            counters, speed slots) travel exact.
        chunk_elems: The all-reduce's elements per chunk.
    """

    def __init__(self, codec: Codec, size: int, lossy: int, chunk_elems: int) -> None:
        if chunk_elems <= 0 or not 0 <= lossy <= size:
            raise ValueError("need chunk_elems > 0 and 0 <= lossy <= size")
        self.codec, self.size, self.chunk_elems = codec, size, chunk_elems
        self.lossy = lossy if codec.lossy else 0
        self.nchunks = -(-size // chunk_elems)
        self._layout = [self._chunk_layout(i) for i in range(self.nchunks)]
        self._offsets = [0]
        for head, pad, exact in self._layout:  # 8-aligned in memory; exact on the wire
            self._offsets.append(self._offsets[-1] + -(-(head + pad + 4 * exact) // 8) * 8)

    @property
    def identity(self) -> bool:
        """Whether every chunk travels as raw float32 (no encoding needed)."""
        return self.lossy == 0

    @property
    def total_bytes(self) -> int:
        """Bytes of a buffer holding every chunk at :meth:`offset`."""
        return self._offsets[-1]

    @property
    def slot_bytes(self) -> int:
        """The largest chunk's wire bytes (a receive slot's size)."""
        return max((self.chunk_bytes(i) for i in range(self.nchunks)), default=0)

    def bounds(self, i: int) -> tuple[int, int]:
        """Element range ``[lo, hi)`` of chunk ``i``."""
        lo = i * self.chunk_elems
        return lo, min(lo + self.chunk_elems, self.size)

    def chunk_bytes(self, i: int) -> int:
        """Payload bytes of chunk ``i`` on the wire."""
        head, pad, exact = self._layout[i]
        return head + pad + 4 * exact

    def offset(self, i: int) -> int:
        """Offset of chunk ``i`` in a :attr:`total_bytes` buffer (a multiple of 8)."""
        return self._offsets[i]

    def _chunk_layout(self, i: int) -> tuple[int, int, int]:
        lo, hi = self.bounds(i)
        k = min(max(self.lossy - lo, 0), hi - lo)
        head = self.codec.wire_bytes(k) if k else 0
        return head, -head % 4 if k < hi - lo else 0, hi - lo - k

    def _parts(self, i: int, values: Any, wire: Any) -> tuple[int, int, np.ndarray,
                                                              np.ndarray]:
        lo, hi = self.bounds(i)
        x = _floats(values)
        if x.size != hi - lo:
            raise ValueError(f"chunk {i} has {hi - lo} values, got {x.size}")
        return lo, min(max(self.lossy - lo, 0), hi - lo), x, _wire(wire, self.chunk_bytes(i))

    def encode(self, i: int, src: Any, dst: Any, feedback: ErrorFeedback | None = None,
               decoded: Any = None, tag: Hashable = None) -> None:
        """Encode chunk ``i``'s values ``src`` into ``dst`` (``chunk_bytes(i)`` bytes).

        Args:
            feedback: Compensate the lossy part with this residual (staged under ``tag``).
            decoded: Optional float32 buffer for what receivers will decode (may be ``src``).
        """
        lo, k, x, w = self._parts(i, src, dst)
        head, pad, _ = self._layout[i]
        out = None if decoded is None else _floats(decoded)
        if k:
            part = None if out is None else out[:k]
            if feedback is not None:
                feedback.encode(lo, lo + k, x[:k], w[:head], part, tag)
            else:
                self.codec.encode(x[:k], w[:head])
                if part is not None:
                    self.codec.decode(w[:head], part)
            w[head : head + pad] = 0
        if k < x.size:
            np.copyto(w[head + pad :].view(_F32), x[k:])
            if out is not None:
                np.copyto(out[k:], x[k:])

    def decode(self, i: int, src: Any, dst: Any) -> None:
        """Overwrite chunk ``i``'s values ``dst`` with what the bytes ``src`` encode."""
        _, k, x, w = self._parts(i, dst, src)
        head, pad, _ = self._layout[i]
        if k:
            self.codec.decode(w[:head], x[:k])
        if k < x.size:
            np.copyto(x[k:], w[head + pad :].view(_F32))

    def decode_add(self, i: int, src: Any, dst: Any) -> None:
        """``dst += decode(src)`` for chunk ``i`` (a child's partial sum into the accumulator)."""
        _, k, x, w = self._parts(i, dst, src)
        head, pad, _ = self._layout[i]
        if k:
            self.codec.decode_add(w[:head], x[:k])
        if k < x.size:
            np.add(x[k:], w[head + pad :].view(_F32), out=x[k:])
