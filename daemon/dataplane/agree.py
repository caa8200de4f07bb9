"""The agreement phase that opens every epoch: do the members agree on the committed step?

A summary of the members' training positions flows up the tree (``AGREE_UP``), the root
decides, and the decision flows down (``AGREE_DOWN``). Each member reports its last committed
step ``c`` and whether it holds the complete, uncommitted result of round ``c + 1`` (it was
*uncertain*: it acked that round but missed the COMMIT). See ``allreduce`` for why
:func:`decide` keeps every survivor bit-identical.
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable
from dataclasses import dataclass

from daemon.dataplane.frames import FrameHeader, Kind
from daemon.dataplane.rounds import Phase, Tag

_SUMMARY = struct.Struct("!qqB")  # low, high, every node at ``low`` holds round low + 1
_DECISION = struct.Struct("!qB")  # agreed committed step, consistent


@dataclass(frozen=True)
class Summary:
    """Training positions of a subtree.

    Attributes:
        low: Smallest last-committed step in the subtree.
        high: Largest last-committed step in the subtree.
        low_hold: Whether every node at ``low`` holds the complete result of round ``low + 1``.
    """

    low: int
    high: int
    low_hold: bool

    @classmethod
    def of(cls, committed: int, holds: bool) -> Summary:
        """One node's summary."""
        return cls(committed, committed, holds)

    def merge(self, other: Summary) -> Summary:
        """Summary of the union of two subtrees."""
        low = min(self.low, other.low)
        hold = all(s.low_hold for s in (self, other) if s.low == low)
        return Summary(low, max(self.high, other.high), hold)

    def pack(self) -> bytes:
        """Wire form."""
        return _SUMMARY.pack(self.low, self.high, int(self.low_hold))

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> Summary:
        """Parse the wire form."""
        low, high, hold = _SUMMARY.unpack(bytes(data))
        return cls(low, high, bool(hold))


@dataclass(frozen=True)
class Decision:
    """The root's verdict.

    Attributes:
        step: The agreed last committed step: every member must be at it before the epoch's
            rounds. A member one behind that holds round ``step``'s result applies it.
        consistent: False if some member cannot reach ``step`` (further behind, or one
            behind without the result). The commit protocol rules this out among members that
            trained together; it means a member entered with a state from the wrong step. That
            member alone is stale and must be re-replicated; the others are at ``step``.
    """

    step: int
    consistent: bool

    def pack(self) -> bytes:
        """Wire form."""
        return _DECISION.pack(self.step, int(self.consistent))

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> Decision:
        """Parse the wire form."""
        step, ok = _DECISION.unpack(bytes(data))
        return cls(step, bool(ok))


def decide(s: Summary) -> Decision:
    """The agreed committed step of the whole tree.

    Everyone at the same step: that step (a held, uncommitted result is dropped, because no
    survivor applied it). Some one step ahead: somebody committed round ``low + 1``, so every
    member held its result when the root committed it, and the ones behind apply it.
    """
    if s.high == s.low:
        return Decision(s.low, True)
    return Decision(s.high, s.high == s.low + 1 and s.low_hold)


class Agreement(Phase):
    """One agreement on this node (tag ``(version, attempt, -1)``), opening the epoch of
    round ``round_step``."""

    def __init__(
        self, tag: Tag, parent: str | None, children: tuple[str, ...], cond: threading.Condition,
        round_step: int,
    ) -> None:  # fmt: skip
        super().__init__(tag, parent, children, cond, round_step)
        self.child_summary: dict[str, Summary | None] = dict.fromkeys(children)
        self.decision: Decision | None = None
        self._bufs: dict[str, bytearray] = {}

    def children_reported(self) -> bool:
        """Whether every child's summary has arrived."""
        return all(s is not None for s in self.child_summary.values())

    def claim_own(
        self, peer: str, h: FrameHeader, is_open: Callable[[], bool]
    ) -> memoryview | None:
        if h.kind is Kind.AGREE_UP and self.child_summary.get(peer, 0) is None:
            self._bufs[peer] = bytearray(_SUMMARY.size)
            return self.sized(peer, h, memoryview(self._bufs[peer]), _SUMMARY.size)
        if h.kind is Kind.AGREE_DOWN and peer == self.parent and self.decision is None:
            self._bufs[peer] = bytearray(_DECISION.size)
            return self.sized(peer, h, memoryview(self._bufs[peer]), _DECISION.size)
        return self.violation(peer, h, "frame does not fit this node's role in the agreement")

    def delivered_own(self, peer: str, h: FrameHeader, payload: memoryview) -> None:
        if h.kind is Kind.AGREE_UP:
            self.child_summary[peer] = Summary.unpack(payload)
        elif h.kind is Kind.AGREE_DOWN:
            self.decision = Decision.unpack(payload)
            self.done = True  # final here, whatever happens to the links afterwards
