"""The agreement phase that opens every epoch: do the members agree on the committed step?

A summary of the members' training positions flows up the tree (``AGREE_UP``), the root
decides, and the decision flows down (``AGREE_DOWN``). Each member reports its last committed
step ``c`` and whether it holds the complete, uncommitted result of round ``c + 1`` (it was
*uncertain*: it acked that round but missed the COMMIT). See ``allreduce`` for why
:func:`decide` keeps every survivor bit-identical.

The divergence guard rides along: a member may add a digest of its complete state at ``c``,
and the summary tallies the digests of the members at the newest step. The root names the
majority digest in its decision; a member whose own digest differs has diverged (a bug, a
bit flip, a nondeterministic kernel) and is re-replicated. The digests change nothing about
which step is agreed.

Wire forms (big-endian)::

    AGREE_UP    low q, high q, low_hold B, n B, then n x (digest 32s, count I)   n <= MAX_TALLY
    AGREE_DOWN  step q, consistent B, digests I, digest length B (0 or 32), digest 32s
                (zero-padded when the length is 0)
"""

from __future__ import annotations

import struct
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from chaos_edge.dataplane.frames import FrameHeader, Kind
from chaos_edge.dataplane.rounds import Phase, Tag

DIGEST_BYTES = 32  # a SHA-256
#: Distinct digests a summary keeps: the frame stays small however many members differ.
MAX_TALLY = 8
_SUMMARY = struct.Struct("!qqBB")  # low, high, every node at ``low`` holds round low + 1, n
_ENTRY = struct.Struct(f"!{DIGEST_BYTES}sI")  # a digest, and how many nodes at ``high`` hold it
_DECISION = struct.Struct(f"!qBIB{DIGEST_BYTES}s")  # step, consistent, digests, length, digest
#: Largest AGREE_UP payload (306 bytes). It must stay within MAX_REASON: early control frames
#: are held only up to that size (``early.py``), a larger one would block its reader thread.
MAX_SUMMARY_BYTES = _SUMMARY.size + MAX_TALLY * _ENTRY.size

Tally = tuple[tuple[bytes, int], ...]


def _bounded(counts: Iterable[tuple[bytes, int]]) -> Tally:
    """Canonical tally: largest counts first (ties: smallest digest), at most MAX_TALLY."""
    return tuple(sorted(counts, key=lambda e: (-e[1], e[0]))[:MAX_TALLY])


def _check_digest(digest: bytes) -> None:
    if len(digest) not in (0, DIGEST_BYTES):
        raise ValueError(f"a state digest has {DIGEST_BYTES} bytes (or none), got {len(digest)}")


@dataclass(frozen=True)
class Summary:
    """Training positions of a subtree.

    Attributes:
        low: Smallest last-committed step in the subtree.
        high: Largest last-committed step in the subtree.
        low_hold: Whether every node at ``low`` holds the complete result of round ``low + 1``.
        tally: ``(digest, count)`` of the state digests of the nodes at ``high`` that gave
            one, largest count first (ties: smallest digest). At most MAX_TALLY distinct
            digests are kept, those with the largest counts: past that many the members
            differ wholesale, and which minority is dropped changes no member's verdict.
    """

    low: int
    high: int
    low_hold: bool
    tally: Tally = ()

    @classmethod
    def of(cls, committed: int, holds: bool, digest: bytes = b"") -> Summary:
        """One node's summary; ``digest`` is of its state at ``committed`` (b"": none)."""
        _check_digest(digest)
        return cls(committed, committed, holds, ((digest, 1),) if digest else ())

    def merge(self, other: Summary) -> Summary:
        """Summary of the union of two subtrees."""
        low = min(self.low, other.low)
        hold = all(s.low_hold for s in (self, other) if s.low == low)
        if self.high != other.high:  # only the digests at the newest step are compared
            tally = (self if self.high > other.high else other).tally
        else:
            counts = dict(self.tally)
            for digest, n in other.tally:
                counts[digest] = counts.get(digest, 0) + n
            tally = _bounded(counts.items())
        return Summary(low, max(self.high, other.high), hold, tally)

    def pack(self) -> bytes:
        """Wire form."""
        head = _SUMMARY.pack(self.low, self.high, int(self.low_hold), len(self.tally))
        return head + b"".join(_ENTRY.pack(d, n) for d, n in self.tally)

    @staticmethod
    def fits(length: int) -> bool:
        """Whether ``length`` bytes can be a summary (checked before a payload is read)."""
        entries, rest = divmod(length - _SUMMARY.size, _ENTRY.size)
        return length >= _SUMMARY.size and rest == 0 and entries <= MAX_TALLY

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> Summary:
        """Parse the wire form.

        Raises:
            ValueError: A malformed summary (a protocol violation).
        """
        raw = bytes(data)
        if not cls.fits(len(raw)):
            raise ValueError(f"a summary of {len(raw)} bytes")
        low, high, hold, n = _SUMMARY.unpack_from(raw)
        if len(raw) != _SUMMARY.size + n * _ENTRY.size:
            raise ValueError(f"a summary of {len(raw)} bytes claims {n} digests")
        entries = [_ENTRY.unpack_from(raw, _SUMMARY.size + i * _ENTRY.size) for i in range(n)]
        if len({d for d, _ in entries}) != n or any(c < 1 for _, c in entries):
            raise ValueError("a summary's digests repeat or have no votes")
        return cls(low, high, bool(hold), _bounded(entries))


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
        digest: The majority state digest of the members at ``step`` (b"" if none gave one).
            A member at ``step`` whose own digest differs has diverged and must be
            re-replicated from the majority.
        digests: How many distinct digests the members at ``step`` gave: 0 none, 1 all
            agree, more: some diverged (at most MAX_TALLY).
    """

    step: int
    consistent: bool
    digest: bytes = b""
    digests: int = 0

    def pack(self) -> bytes:
        """Wire form."""
        _check_digest(self.digest)
        return _DECISION.pack(self.step, int(self.consistent), self.digests, len(self.digest),
                              self.digest.ljust(DIGEST_BYTES, b"\0"))  # fmt: skip

    @classmethod
    def unpack(cls, data: bytes | bytearray | memoryview) -> Decision:
        """Parse the wire form.

        Raises:
            ValueError: A malformed decision (a protocol violation).
        """
        raw = bytes(data)
        if len(raw) != _DECISION.size:
            raise ValueError(f"a decision of {len(raw)} bytes, expected {_DECISION.size}")
        step, ok, digests, length, padded = _DECISION.unpack(raw)
        if length not in (0, DIGEST_BYTES) or (length == 0) != (digests == 0):
            raise ValueError(f"a decision with a {length}-byte digest among {digests}")
        if length == 0 and padded.strip(b"\0"):
            raise ValueError("a decision without a digest carries digest bytes")
        return cls(step, bool(ok), padded[:length], digests)


def decide(s: Summary, own_digest: bytes = b"") -> Decision:
    """The agreed committed step of the whole tree, and its majority state digest.

    Everyone at the same step, and every one of them holding the result of the next round:
    that next round (they all apply it). A root outside this epoch may have committed it: a
    frozen root thaws, finds every ACK in its socket and commits after its members moved on
    without it. Applying what they all hold keeps them equal to that root; a rerun would give
    the round a second result. All hold the same one: a member's held result is that of the
    last attempt of the round it ran, and an attempt's result exists only once every member of
    its epoch gave its input, replacing what it held before.

    Everyone at the same step otherwise: that step (a held, uncommitted result is dropped: some
    member lacks it, so no root committed it, or only one a new member never trained with).
    Some one step ahead: somebody committed round ``low + 1``, so every member held its result
    when the root committed it, and the ones behind apply it.

    The digest is the one most members at that step gave. A tie (two members that differ,
    say) goes to ``own_digest``, the root's, if it is among the tied, else to the smallest
    digest. Without a majority nobody can tell which side is right, so one side is kept by a
    rule every node can check, as DDP keeps rank 0's state at start-up: the root holds a
    copy of its side already, and keeping it re-replicates only the others.

    Args:
        s: The whole tree's summary.
        own_digest: The root's digest of its state at ``s.high`` (b"" if the root is behind
            or gave none).
    """
    if s.high == s.low and s.low_hold:
        # The tally is of the step before the one agreed: nothing is compared this time.
        return Decision(s.low + 1, True)
    digest = b""
    if s.tally:
        best = max(n for _, n in s.tally)
        tied = [d for d, n in s.tally if n == best]
        digest = own_digest if own_digest in tied else min(tied)
    if s.high == s.low:
        return Decision(s.low, True, digest, len(s.tally))
    return Decision(s.high, s.high == s.low + 1 and s.low_hold, digest, len(s.tally))


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
            if not Summary.fits(h.length):
                return self.violation(peer, h, f"a summary of {h.length} bytes")
            self._bufs[peer] = bytearray(h.length)
            return memoryview(self._bufs[peer])
        if h.kind is Kind.AGREE_DOWN and peer == self.parent and self.decision is None:
            self._bufs[peer] = bytearray(_DECISION.size)
            return self.sized(peer, h, memoryview(self._bufs[peer]), _DECISION.size)
        return self.violation(peer, h, "frame does not fit this node's role in the agreement")

    def delivered_own(self, peer: str, h: FrameHeader, payload: memoryview) -> None:
        try:
            if h.kind is Kind.AGREE_UP:
                self.child_summary[peer] = Summary.unpack(payload)
            elif h.kind is Kind.AGREE_DOWN:
                self.decision = Decision.unpack(payload)
                self.done = True  # final here, whatever happens to the links afterwards
        except ValueError as exc:
            self.violation(peer, h, str(exc))
