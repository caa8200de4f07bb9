"""The manifest of a state byte space, its block checksums, and byte-range verification.

A manifest lists every entry (name, dtype, shape, offset, nbytes) of one contiguous byte space,
its version (the training step), its size, and a digest per fixed-size block (SHA-256 cut to
128 bits: the CPUs we run on hash it in hardware, twice as fast as blake2b, and the receiver's
CPU is what a fast scale-out runs short of). A receiver checks each block it holds against the
manifest and fetches a bad or short block again.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from chaos_edge.replication.errors import ManifestError

FORMAT = "chaos-state/1"
BLOCK_SIZE = 1 << 20  # 1 MiB: small enough to re-fetch, large enough to hash fast
DIGEST_SIZE = 16  # 128 bits detect corruption; a transfer is not an adversary
RAW_DTYPE = "bytes"  # entries that are raw bytes (the JSON metadata), not tensors

# Bytes per element of each dtype a manifest may name.
ITEMSIZE = {
    "float64": 8, "float32": 4, "float16": 2, "bfloat16": 2, "complex64": 8, "complex128": 16,
    "int64": 8, "int32": 4, "int16": 2, "int8": 1, "uint8": 1, "uint16": 2, "uint32": 4,
    "uint64": 8, "bool": 1, RAW_DTYPE: 1,
}  # fmt: skip


@dataclass(frozen=True)
class Entry:
    """One tensor (or raw blob) of the byte space."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    """Layout and checksums of one captured training state.

    Attributes:
        version: The training step the state belongs to.
        total_bytes: Size of the byte space.
        block_size: Size of a checksum block (the last block may be shorter).
        blocks: Hex digest of each block (:func:`digest`).
        entries: The entries, in byte order, back to back.
        format: Format tag, checked on load.
    """

    version: int
    total_bytes: int
    block_size: int
    blocks: tuple[str, ...]
    entries: tuple[Entry, ...]
    format: str = FORMAT

    @property
    def num_blocks(self) -> int:
        """Number of checksum blocks."""
        return -(-self.total_bytes // self.block_size)

    def block_range(self, index: int) -> tuple[int, int]:
        """``(offset, length)`` of block ``index``."""
        start = index * self.block_size
        return start, min(self.block_size, self.total_bytes - start)

    def segments(self) -> list[int]:
        """Entry sizes in byte order: the segments a planner splits into shards."""
        return [e.nbytes for e in self.entries]

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    def to_json(self) -> str:
        """Serialise deterministically."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Manifest:
        """Build and validate a manifest.

        Raises:
            ManifestError: If a field is missing or wrong, or the layout is inconsistent.
        """
        if not isinstance(data, Mapping):
            raise ManifestError("manifest must be a JSON object")
        if data.get("format") != FORMAT:
            raise ManifestError(f"unsupported manifest format {data.get('format')!r}")
        try:
            entries = tuple(
                Entry(
                    str(e["name"]),
                    str(e["dtype"]),
                    tuple(int(x) for x in e["shape"]),
                    int(e["offset"]),
                    int(e["nbytes"]),
                )
                for e in data["entries"]
            )
            manifest = cls(
                int(data["version"]), int(data["total_bytes"]), int(data["block_size"]),
                tuple(str(b) for b in data["blocks"]), entries,
            )  # fmt: skip
        except (KeyError, TypeError, ValueError) as exc:
            raise ManifestError(f"malformed manifest: {exc!r}") from None
        manifest.validate()
        return manifest

    @classmethod
    def from_json(cls, text: str | bytes) -> Manifest:
        """Parse and validate a manifest; raises :class:`ManifestError` on bad input."""
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ManifestError(f"manifest is not valid JSON: {exc}") from None
        return cls.from_dict(data)

    def validate(self) -> None:
        """Check the layout; raises :class:`ManifestError` naming the first problem."""
        if self.version < 0 or self.total_bytes < 0 or self.block_size <= 0:
            raise ManifestError("version and total_bytes must be >= 0, block_size > 0")
        if len(self.blocks) != self.num_blocks:
            raise ManifestError(f"expected {self.num_blocks} block digests, got {len(self.blocks)}")
        for digest in self.blocks:
            if len(digest) != 2 * DIGEST_SIZE or any(c not in "0123456789abcdef" for c in digest):
                raise ManifestError(f"bad block digest {digest!r}")
        offset = 0
        names: set[str] = set()
        for e in self.entries:
            if e.name in names:
                raise ManifestError(f"duplicate entry {e.name!r}")
            names.add(e.name)
            if e.dtype not in ITEMSIZE:
                raise ManifestError(f"entry {e.name!r}: unknown dtype {e.dtype!r}")
            if e.offset != offset:
                raise ManifestError(f"entry {e.name!r}: offset {e.offset}, expected {offset}")
            if any(d < 0 for d in e.shape) or e.nbytes != math.prod(e.shape) * ITEMSIZE[e.dtype]:
                raise ManifestError(f"entry {e.name!r}: nbytes does not match dtype and shape")
            offset += e.nbytes
        if offset != self.total_bytes:
            raise ManifestError(f"entries cover {offset} bytes, total_bytes is {self.total_bytes}")


def digest(block: bytes | bytearray | memoryview) -> str:
    """The hex digest of one block: SHA-256, first ``DIGEST_SIZE`` bytes."""
    return hashlib.sha256(block).digest()[:DIGEST_SIZE].hex()


def block_digests(buffer: bytes | bytearray | memoryview, block_size: int) -> tuple[str, ...]:
    """Hex digests of consecutive ``block_size`` blocks of ``buffer``."""
    view = memoryview(buffer).cast("B")
    return tuple(digest(view[i : i + block_size]) for i in range(0, len(view), block_size))


def verify_range(
    manifest: Manifest,
    offset: int,
    data: bytes | bytearray | memoryview,
    length: int | None = None,
) -> list[int]:
    """Check the blocks of a received byte range.

    Args:
        manifest: The sender's manifest.
        offset: Where ``data`` starts in the byte space.
        data: The bytes received.
        length: How many bytes were requested (``len(data)`` when None); a shorter ``data``
            makes the blocks it does not fully hold bad.

    Returns:
        Indices of the blocks lying wholly inside ``[offset, offset + length)`` that are
        corrupt or incomplete. Blocks only partly inside the range are not checked here:
        check them with :func:`verify_buffer` once their other part has arrived (plans
        aligned to ``manifest.block_size`` have no such blocks).

    Raises:
        ManifestError: If the range lies outside the byte space.
    """
    view = memoryview(data).cast("B")
    length = len(view) if length is None else length
    if offset < 0 or length < 0 or offset + length > manifest.total_bytes:
        raise ManifestError(f"range ({offset}, {length}) is outside the state")
    bs = manifest.block_size
    end = offset + length
    first = -(-offset // bs)
    bad: list[int] = []
    for index in range(first, manifest.num_blocks):
        start, size = manifest.block_range(index)
        if start + size > end:
            break
        chunk = view[start - offset : start - offset + size]
        if len(chunk) != size or digest(chunk) != manifest.blocks[index]:
            bad.append(index)
    return bad


def verify_buffer(manifest: Manifest, buffer: bytes | bytearray | memoryview) -> list[int]:
    """Indices of the corrupt blocks of a whole assembled buffer (all of them if it is short)."""
    if len(memoryview(buffer).cast("B")) != manifest.total_bytes:
        return list(range(manifest.num_blocks))
    return verify_range(manifest, 0, buffer)


def blocks_to_ranges(manifest: Manifest, indices: Sequence[int]) -> list[tuple[int, int]]:
    """Byte ranges to fetch again for bad blocks."""
    return [manifest.block_range(i) for i in sorted(set(indices))]
