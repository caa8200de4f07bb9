"""Control frames of a phase this node has not opened yet, kept off the reader thread.

A reader that waits for a frame's phase to open holds up everything behind it on that link.
For bulk REDUCE/BCAST chunks that is the back-pressure we want. For a control frame it can
deadlock: a source of a new node may open the agreement with it (an AGREE_UP of a few bytes)
while the state offer the new node needs is queued behind that frame on the same link, and
the new node can only open the agreement once it has that state. Control frames are tiny, so
they wait here instead (bounded), and are replayed in arrival order when their phase opens.
All methods are called with the all-reduce's condition held.
"""

from __future__ import annotations

from chaos_edge.dataplane.frames import FrameHeader, Kind
from chaos_edge.dataplane.rounds import MAX_REASON, Tag

EARLY_KINDS = frozenset({Kind.AGREE_UP, Kind.AGREE_DOWN, Kind.ABORT, Kind.COUNT, Kind.TOTAL,
                         Kind.ACK, Kind.COMMIT})  # fmt: skip
MAX_HELD = 256  # frames held at once; past it, readers wait as for bulk frames

Held = tuple[str, FrameHeader, bytes]


class EarlyFrames:
    """Bounded, ordered store of early control frames."""

    def __init__(self) -> None:
        self._held: list[Held] = []
        self._landing: dict[str, tuple[FrameHeader, bytearray]] = {}  # peer -> frame in flight

    def take(self, peer: str, h: FrameHeader) -> memoryview | None:
        """A buffer for an early frame's payload, or None if the reader must wait instead."""
        if (h.kind not in EARLY_KINDS or h.length > MAX_REASON
                or len(self._held) + len(self._landing) >= MAX_HELD):  # fmt: skip
            return None
        buf = bytearray(h.length)
        self._landing[peer] = (h, buf)
        return memoryview(buf)

    def landed(self, peer: str, h: FrameHeader) -> bytes | None:
        """The payload of ``h`` if it is an early frame (it has fully arrived), else None."""
        got = self._landing.get(peer)
        if got is None or got[0] is not h:
            return None
        del self._landing[peer]
        return bytes(got[1])

    def hold(self, peer: str, h: FrameHeader, payload: bytes) -> None:
        """Keep a landed early frame until its phase opens."""
        self._held.append((peer, h, payload))

    def release(self, tag: Tag) -> tuple[list[Held], list[Held]]:
        """The held frames of phase ``tag`` (in arrival order), and those of older phases
        (dropped: we started past them). Newer ones stay."""
        due = [f for f in self._held if f[1].round_tag == tag]
        old = [f for f in self._held if f[1].round_tag < tag]
        self._held = [f for f in self._held if f[1].round_tag > tag]
        return due, old

    def forget(self, peer: str) -> None:
        """Drop what ``peer`` sent (its link closed: the frames a blocked reader held would
        have been dropped with it too)."""
        self._held = [f for f in self._held if f[0] != peer]
        self._landing.pop(peer, None)
