"""An immutable state snapshot: the bytes of a state at a step boundary and their manifest."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from chaos_edge.replication.errors import ManifestError
from chaos_edge.replication.manifest import Manifest

Buffer = bytes | bytearray | memoryview


class CapturedState(Protocol):
    """What :meth:`Snapshot.of` needs: a :class:`~chaos_edge.replication.state.StateSpace`."""

    @property
    def manifest(self) -> Manifest: ...

    @property
    def buffer(self) -> bytearray: ...


@dataclass(frozen=True)
class Snapshot:
    """The bytes of a state at a step boundary and their manifest; never written while served.

    Attributes:
        manifest: The state's manifest (its ``version`` is what requests must name).
        data: A read-only view of exactly ``manifest.total_bytes`` bytes.
    """

    manifest: Manifest
    data: memoryview

    @classmethod
    def create(cls, manifest: Manifest, buffer: Buffer) -> Snapshot:
        """Wrap a buffer (bytes, bytearray, mmap, ...) without copying it.

        Raises:
            ManifestError: If the buffer's size is not the manifest's.
        """
        view = memoryview(buffer).cast("B").toreadonly()
        if len(view) != manifest.total_bytes:
            raise ManifestError(
                f"snapshot has {len(view)} bytes, manifest says {manifest.total_bytes}"
            )
        return cls(manifest, view)

    @classmethod
    def of(cls, state: CapturedState) -> Snapshot:
        """The snapshot of a captured :class:`StateSpace` (its buffer is already a copy)."""
        return cls.create(state.manifest, state.buffer)
