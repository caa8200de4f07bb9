"""Options and results of :func:`chaos_edge.replication.transfer.fetch.fetch`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from chaos_edge.replication.planning.model import ReplicationPlan

#: ``progress(source, bytes_done, bytes_assigned)``, called from the fetch threads.
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FetchOptions:
    """Knobs of :func:`fetch`.

    Attributes:
        window: Most range requests in flight per source.
        pipeline: Fewest range requests in flight per source.
        lead_s: Seconds of a source's traffic (at its observed rate) kept requested ahead of
            what has arrived, plus its round trip (``2 * t_prop_s``). The sender's socket
            buffers hold that much, so its link keeps running while the receiving thread
            waits for a CPU; bytes not yet requested can still go to another source.
        piece_s: A request asks for about this many seconds of a source's observed rate
            (small requests let the others take over a slow source's tail late and precisely).
        min_piece_bytes: Smallest request (bounds the per-request overhead).
        max_piece_bytes: Largest request.
        rebalance: When a source has nothing left to request, take the tail of the source
            predicted to finish last (see :mod:`~chaos_edge.replication.transfer.balance`). Off,
            every source sends exactly its planned share (the baselines' behaviour).
        verify_threads: Threads that verify blocks as they complete (0: the receiving
            thread verifies them itself).
        connect_timeout: Seconds to connect and authenticate.
        io_timeout: A source silent this long mid-transfer has failed.
        same_source_tries: Re-fetches of a bad block from the same source before another.
        max_block_tries: Re-fetches of one block before the fetch gives up.
        replan_planner: Planner (registry name) for a failed source's undelivered bytes.
        deadline_s: Give up after this many seconds (None: no overall deadline).
    """

    window: int = 32
    pipeline: int = 2
    lead_s: float = 0.2
    piece_s: float = 0.05
    min_piece_bytes: int = 128 << 10
    max_piece_bytes: int = 8 << 20
    rebalance: bool = True
    verify_threads: int = 2
    connect_timeout: float = 5.0
    io_timeout: float = 10.0
    same_source_tries: int = 2
    max_block_tries: int = 6
    replan_planner: str = "waterfill"
    deadline_s: float | None = None


@dataclass(frozen=True)
class SourceTiming:
    """What one source did, in seconds since the fetch started.

    Attributes:
        id: The source.
        start_s: When its first request went out (None if it was never asked for anything).
        end_s: When its last byte arrived (None if none did).
        bytes: Bytes it delivered (re-fetches included).
        assigned_bytes: Bytes it was finally responsible for: its planned share, plus what
            it took over (re-plans, steals), minus what others took from it; repairs not.
        failed: Why it failed, or None.
        taken_bytes: Bytes it took over from the queues of slower sources.
        given_bytes: Bytes faster sources took over from its queue.
    """

    id: str
    start_s: float | None
    end_s: float | None
    bytes: int
    assigned_bytes: int
    failed: str | None
    taken_bytes: int = 0
    given_bytes: int = 0


@dataclass(frozen=True)
class Steal:
    """Bytes one source took over from another's queue while the fetch ran.

    Attributes:
        thief: The source that took them (it had nothing left to request).
        victim: The source predicted to finish last.
        ranges: The byte ranges moved.
        at_s: Seconds since the fetch started.
    """

    thief: str
    victim: str
    ranges: tuple[tuple[int, int], ...]
    at_s: float

    @property
    def nbytes(self) -> int:
        """Bytes moved."""
        return sum(n for _, n in self.ranges)


@dataclass(frozen=True)
class FetchResult:
    """The verified state bytes and how they came.

    Attributes:
        buffer: The state, every block verified against the manifest.
        delay_s: Seconds from the start of the fetch to the last verified block.
        sources: Per-source timings.
        replans: The plans made for failed sources, in order.
        refetched_blocks: Blocks that failed verification and were fetched again.
        steals: Work moved between sources by rebalancing, in order.
    """

    buffer: bytearray
    delay_s: float
    sources: dict[str, SourceTiming]
    replans: list[ReplicationPlan]
    refetched_blocks: list[int]
    steals: list[Steal] = field(default_factory=list)
