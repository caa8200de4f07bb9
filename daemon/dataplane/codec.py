"""Wire formats of the all-reduce: how chunks of float32 values travel between nodes.

A cluster picks one format (``[training] wire`` in chaosd.toml(5)); the scheduler puts it in
every :class:`~daemon.contracts.policy.SyncPolicy`, so all members of a policy encode alike.
Formats (all little-endian, like the fp32 frames), for ``n`` values:

- ``fp32``: the values as they are, ``4n`` bytes (the default; lossless).
- ``fp16``: IEEE binary16, ``2n`` bytes, rounded to nearest even. Values beyond +-65504
  become +-inf (as in torch's fp16 AMP): the sums sent up the tree are sample-weighted, so a
  cluster without a GradScaler is safer with bf16.
- ``bf16``: the upper half of each float32, rounded to nearest even, ``2n`` bytes; fp32's
  range with 8 bits of mantissa.
- ``int8``: ``n + 4 * ceil(n / INT8_BLOCK)`` bytes: one float32 scale per block of
  :data:`INT8_BLOCK` values, then one int8 per value. The scale is ``max|x| / 127``, a value is
  sent as ``round(x * 127 / max|x|)`` (to nearest even) and decodes as ``q * scale``, within
  ``scale / 2`` of ``x`` (plus float32 rounding, under 1e-4 of that). A block whose max-abs is
  below ``2**-100`` is sent as zeros (scale 0); a block holding inf or nan gets scale NaN and
  decodes to NaN throughout, so a GradScaler still sees the overflow.

Decoding is exact arithmetic on the bytes (a cast, or one float32 multiply per value), so the
same bytes decode to bit-identical floats on every member. That is what keeps compression
compatible with the commit protocol: the root encodes each final chunk once and every member,
the root included, decodes those bytes; relays forward them unchanged.

Layers: a :class:`Codec` encodes a run of values; a :class:`WirePlan` splits one round's vector
into the all-reduce's chunks and keeps its tail exact (only a lossy prefix, the gradients, is
compressed); :class:`ErrorFeedback` adds back what the last committed round lost. The work is
vectorised numpy, plus torch for the fp16/bf16 casts, all on the calling thread.

In the all-reduce, with ``plan = WirePlan(codec_for(policy.wire), size, lossy, chunk_elems)``:
a node computes its chunk's partial sum as today but adds each child's chunk with
``plan.decode_add``, then sends ``plan.encode(i, acc, wire, feedback=up, tag=tag)``'s bytes
up; the root divides and encodes with ``feedback=root, decoded=acc``, so its own result is
what the members decode, and sends those bytes down; a relay forwards the bytes it got and
decodes them into its output with ``plan.decode``. ``plan.identity`` keeps the raw fp32 path.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from collections.abc import Hashable, Iterator
from typing import Any

import numpy as np
import torch

from daemon.contracts.policy import WIRE_FORMATS

#: Values per int8 scale. Part of the format: every member must use the same.
INT8_BLOCK = 2048
_TINY = 2.0**-100  # int8 blocks below this max-abs are sent as zeros (keeps scales normal)
#: Values processed at a time (a multiple of INT8_BLOCK): a piece and its scratch stay in
#: cache between the passes over it.
PIECE = 1 << 16
# torch casts run in slices this long: below torch's grain size (32768) an op runs on the
# calling thread. Its intra-op pool would spin against the reader threads on a small box.
_SERIAL = 1 << 15
_local = threading.local()  # per-thread scratch: the pipeline may encode on several threads
_F32 = np.dtype("<f4")


def _scratch(n: int, slot: str) -> np.ndarray:
    """A float32 scratch array of ``n`` values, reused by this thread (one per ``slot``)."""
    buf: np.ndarray | None = getattr(_local, slot, None)
    if buf is None or buf.size < n:
        buf = np.empty(max(n, PIECE), np.float32)
        setattr(_local, slot, buf)
    return buf[:n]


def _floats(a: Any) -> np.ndarray:
    """A flat float32 array sharing ``a``'s memory (numpy array or CPU torch tensor)."""
    if isinstance(a, torch.Tensor):
        if a.device.type != "cpu":
            raise ValueError("codec values must be in CPU memory")
        a = a.detach().numpy()
    arr = np.asarray(a)
    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
        raise ValueError("codec values must be a contiguous float32 buffer")
    return arr.reshape(-1)


def _wire(buf: Any, nbytes: int) -> np.ndarray:
    """A uint8 array over a wire buffer (bytes-like, uint8 array or tensor) of ``nbytes``."""
    if isinstance(buf, torch.Tensor):
        buf = buf.detach().numpy()
    if isinstance(buf, np.ndarray):
        if not buf.flags.c_contiguous:
            raise ValueError("wire buffer must be contiguous")
        arr = buf.reshape(-1).view(np.uint8)
    else:
        arr = np.frombuffer(buf, np.uint8)
    if arr.size != nbytes:
        raise ValueError(f"wire buffer of {arr.size} bytes, expected {nbytes}")
    return arr


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A tensor over ``a`` (copied first if read-only, which torch does not support)."""
    return torch.from_numpy(a if a.flags.writeable else a.copy())


class Codec(ABC):
    """One wire format. Stateless and thread-safe; get one with :func:`codec_for`.

    Wire buffers are bytes-like objects, uint8 numpy arrays or tensors (writable where
    written); values are contiguous float32 numpy arrays or CPU tensors. Work runs on the
    calling thread, in cache-sized pieces of :data:`PIECE` values.

    Attributes:
        name: The format's name, one of :data:`WIRE_FORMATS`.
        lossy: Whether decoding may differ from the input.
    """

    name: str = ""
    lossy: bool = True

    @abstractmethod
    def wire_bytes(self, n: int) -> int:
        """Bytes that ``n`` values take on the wire."""

    def encode(self, src: Any, dst: Any) -> None:
        """Encode the float32 values ``src`` into ``dst``, exactly ``wire_bytes(len(src))``
        bytes. Deterministic: the same values give the same bytes."""
        x = _floats(src)
        n = x.size
        w = _wire(dst, self.wire_bytes(n))
        with np.errstate(all="ignore"):  # inf/nan are handled, not warned about
            for a in range(0, n, PIECE):
                self._encode(x[a : a + PIECE], w, n, a)

    def decode(self, src: Any, dst: Any) -> None:
        """Overwrite the float32 buffer ``dst`` with the values the bytes ``src`` encode."""
        self._decode_all(src, dst, add=False)

    def decode_add(self, src: Any, dst: Any) -> None:
        """``dst += decode(src)``, with no temporary beyond a per-thread piece."""
        self._decode_all(src, dst, add=True)

    def _decode_all(self, src: Any, dst: Any, add: bool) -> None:
        x = _floats(dst)
        n = x.size
        w = _wire(src, self.wire_bytes(n))
        with np.errstate(all="ignore"):
            for a in range(0, n, PIECE):
                self._decode(w, n, a, x[a : a + PIECE], add)

    @abstractmethod
    def _encode(self, x: np.ndarray, w: np.ndarray, n: int, a: int) -> None:
        """Encode the piece ``x``: values ``[a, a + len(x))`` of the ``n`` that ``w`` holds."""

    @abstractmethod
    def _decode(self, w: np.ndarray, n: int, a: int, x: np.ndarray, add: bool) -> None:
        """Decode values ``[a, a + len(x))`` of the ``n`` that ``w`` holds into (or onto) ``x``."""

    def __repr__(self) -> str:
        return f"codec_for({self.name!r})"


class _Fp32(Codec):
    name, lossy = "fp32", False

    def wire_bytes(self, n: int) -> int:
        return 4 * n

    def _encode(self, x: np.ndarray, w: np.ndarray, n: int, a: int) -> None:
        np.copyto(w[4 * a : 4 * (a + x.size)].view(_F32), x)

    def _decode(self, w: np.ndarray, n: int, a: int, x: np.ndarray, add: bool) -> None:
        part = w[4 * a : 4 * (a + x.size)].view(_F32)
        np.add(x, part, out=x) if add else np.copyto(x, part)


class _Half(Codec):
    """fp16 and bf16: a torch cast each way (numpy has no bf16, and its fp16 cast is slow).
    torch rounds to nearest even and keeps NaN NaN; decoding is exact."""

    def __init__(self, name: str, dtype: torch.dtype) -> None:
        self.name, self.dtype = name, dtype

    def wire_bytes(self, n: int) -> int:
        return 2 * n

    def _encode(self, x: np.ndarray, w: np.ndarray, n: int, a: int) -> None:
        tw = torch.from_numpy(w[2 * a : 2 * (a + x.size)]).view(self.dtype)
        tx = _tensor(x)
        for s in range(0, x.size, _SERIAL):
            tw[s : s + _SERIAL].copy_(tx[s : s + _SERIAL])

    def _decode(self, w: np.ndarray, n: int, a: int, x: np.ndarray, add: bool) -> None:
        tw = _tensor(w[2 * a : 2 * (a + x.size)]).view(self.dtype)
        tx = torch.from_numpy(x)
        for s in range(0, x.size, _SERIAL):
            part = tw[s : s + _SERIAL]
            tx[s : s + _SERIAL].add_(part) if add else tx[s : s + _SERIAL].copy_(part)


def _blocks(n: int) -> Iterator[tuple[int, int, int]]:
    """``(first value, rows, width)`` of the full int8 blocks, then of the short last one."""
    full = n // INT8_BLOCK
    if full:
        yield 0, full, INT8_BLOCK
    if n % INT8_BLOCK:
        yield full * INT8_BLOCK, 1, n % INT8_BLOCK


class _Int8(Codec):
    name = "int8"

    def wire_bytes(self, n: int) -> int:
        return n + 4 * -(-n // INT8_BLOCK)

    @staticmethod
    def _split(w: np.ndarray, n: int, a: int) -> tuple[np.ndarray, np.ndarray]:
        """The scales and the int8 values from value ``a`` (a block start) on."""
        nb = -(-n // INT8_BLOCK)
        return w[: 4 * nb].view(_F32)[a // INT8_BLOCK :], w[4 * nb + a :].view(np.int8)

    def _encode(self, x: np.ndarray, w: np.ndarray, n: int, a: int) -> None:
        scales, q = self._split(w, n, a)
        tmp = _scratch(x.size, "int8")
        for lo, rows, width in _blocks(x.size):
            hi, b0 = lo + rows * width, lo // INT8_BLOCK
            xb, tb = x[lo:hi].reshape(rows, width), tmp[lo:hi].reshape(rows, width)
            peak = np.maximum(xb.max(1), -xb.min(1))  # NaN propagates
            bad = ~np.isfinite(peak)
            usable = (peak >= _TINY) & ~bad
            # x * (127 / peak) rounds like x / scale within 2**-21 of a step, and a multiply
            # is far cheaper than a divide; |x| * 127 / peak <= 127 (1 + 2**-22) stays int8.
            mult = np.ones(rows, np.float32)
            np.divide(np.float32(127), peak, out=mult, where=usable)
            np.multiply(xb, mult[:, None], out=tb)
            np.rint(tb, out=tb)  # half to even
            scale = np.zeros(rows, np.float32)
            np.divide(peak, np.float32(127), out=scale, where=usable)
            if bad.any():
                tb[bad] = 0.0
                scale[bad] = np.nan
            scales[b0 : b0 + rows] = scale
            q[lo:hi] = tmp[lo:hi]

    def _decode(self, w: np.ndarray, n: int, a: int, x: np.ndarray, add: bool) -> None:
        scales, q = self._split(w, n, a)
        out = _scratch(x.size, "int8") if add else x
        for lo, rows, width in _blocks(x.size):
            hi, b0 = lo + rows * width, lo // INT8_BLOCK
            # float(q) * scale, one rounding: the same bits on every IEEE machine
            np.multiply(q[lo:hi].reshape(rows, width), scales[b0 : b0 + rows, None],
                        out=out[lo:hi].reshape(rows, width))
        if add:
            np.add(x, out, out=x)


_CODECS: dict[str, Codec] = {
    c.name: c
    for c in (_Fp32(), _Half("fp16", torch.float16), _Half("bf16", torch.bfloat16), _Int8())
}
assert tuple(_CODECS) == WIRE_FORMATS, "codec registry and WIRE_FORMATS disagree"


def codec_for(name: str) -> Codec:
    """The codec of a wire format (one of :data:`WIRE_FORMATS`).

    Raises:
        ValueError: An unknown name.
    """
    try:
        return _CODECS[name]
    except KeyError:
        raise ValueError(f"unknown wire format {name!r} (known: {', '.join(WIRE_FORMATS)})"
                         ) from None


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
