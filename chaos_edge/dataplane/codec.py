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

Layers: a :class:`Codec` (here) encodes a run of values; a
:class:`~chaos_edge.dataplane.wireplan.WirePlan` splits one round's vector into the all-reduce's
chunks and keeps its tail exact (only a lossy prefix, the gradients, is compressed);
:class:`~chaos_edge.dataplane.wireplan.ErrorFeedback` adds back what the last committed round
lost. The work is vectorised numpy, plus torch for the fp16/bf16 casts, all on the calling
thread.

In the all-reduce, with ``plan = WirePlan(codec_for(policy.wire), size, lossy, chunk_elems)``:
a node computes its chunk's partial sum as today but adds each child's chunk with
``plan.decode_add``, then sends ``plan.encode(i, acc, wire, feedback=up, tag=tag)``'s bytes
up; the root divides and encodes with ``feedback=root, decoded=acc``, so its own result is
what the members decode, and sends those bytes down; a relay forwards the bytes it got and
decodes them into its output with ``plan.decode``. ``plan.identity`` keeps the raw fp32 path.
"""

from __future__ import annotations

import importlib
import threading
from abc import ABC, abstractmethod
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
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


def _torch() -> Any:
    """torch, imported on first use: a process that never casts to fp16/bf16 or passes
    tensors (a bench worker, a test node) does not pay its import."""
    return importlib.import_module("torch")


def _is_tensor(a: Any) -> bool:
    return type(a).__module__.startswith("torch")


def _floats(a: Any) -> np.ndarray:
    """A flat float32 array sharing ``a``'s memory (numpy array or CPU torch tensor)."""
    if _is_tensor(a):
        if a.device.type != "cpu":
            raise ValueError("codec values must be in CPU memory")
        a = a.detach().numpy()
    arr = np.asarray(a)
    if arr.dtype != np.float32 or not arr.flags.c_contiguous:
        raise ValueError("codec values must be a contiguous float32 buffer")
    return arr.reshape(-1)


def _wire(buf: Any, nbytes: int) -> np.ndarray:
    """A uint8 array over a wire buffer (bytes-like, uint8 array or tensor) of ``nbytes``."""
    if _is_tensor(buf):
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
    return _torch().from_numpy(a if a.flags.writeable else a.copy())


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

    def warm(self) -> None:
        """Load what the format needs (torch, for fp16/bf16) now, on the calling thread, not
        in the middle of a round whose neighbours wait for it."""
        return

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

    def __init__(self, name: str, dtype: str) -> None:
        self.name, self._dtype = name, dtype

    def warm(self) -> None:
        _torch()

    @property
    def dtype(self) -> torch.dtype:
        """The torch dtype of the format (looked up when first cast)."""
        return getattr(_torch(), self._dtype)

    def wire_bytes(self, n: int) -> int:
        return 2 * n

    def _encode(self, x: np.ndarray, w: np.ndarray, n: int, a: int) -> None:
        tw = _torch().from_numpy(w[2 * a : 2 * (a + x.size)]).view(self.dtype)
        tx = _tensor(x)
        for s in range(0, x.size, _SERIAL):
            tw[s : s + _SERIAL].copy_(tx[s : s + _SERIAL])

    def _decode(self, w: np.ndarray, n: int, a: int, x: np.ndarray, add: bool) -> None:
        tw = _tensor(w[2 * a : 2 * (a + x.size)]).view(self.dtype)
        tx = _torch().from_numpy(x)
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
    for c in (_Fp32(), _Half("fp16", "float16"), _Half("bf16", "bfloat16"), _Int8())
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
