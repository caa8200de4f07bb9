"""Options and results of :func:`daemon.replication.transfer.fetch.fetch`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from daemon.replication.planning.model import ReplicationPlan

#: ``progress(source, bytes_done, bytes_assigned)``, called from the fetch threads.
ProgressFn = Callable[[str, int, int], None]


@dataclass(frozen=True)
class FetchOptions:
    """Knobs of :func:`fetch`.

    Attributes:
        window: Range requests in flight per source (hides the round trip between ranges).
        connect_timeout: Seconds to connect and authenticate.
        io_timeout: A source silent this long mid-transfer has failed.
        same_source_tries: Re-fetches of a bad block from the same source before another.
        max_block_tries: Re-fetches of one block before the fetch gives up.
        replan_planner: Planner (registry name) for a failed source's undelivered bytes.
        deadline_s: Give up after this many seconds (None: no overall deadline).
    """

    window: int = 32
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
        assigned_bytes: Bytes planned onto it (re-plans included, repairs not).
        failed: Why it failed, or None.
    """

    id: str
    start_s: float | None
    end_s: float | None
    bytes: int
    assigned_bytes: int
    failed: str | None


@dataclass(frozen=True)
class FetchResult:
    """The verified state bytes and how they came.

    Attributes:
        buffer: The state, every block verified against the manifest.
        delay_s: Seconds from the start of the fetch to the last verified block.
        sources: Per-source timings.
        replans: The plans made for failed sources, in order.
        refetched_blocks: Blocks that failed verification and were fetched again.
    """

    buffer: bytearray
    delay_s: float
    sources: dict[str, SourceTiming]
    replans: list[ReplicationPlan]
    refetched_blocks: list[int]
