"""Dynamic rebalancing of a fetch: rate estimates, request sizes, and how much work to steal.

A plan splits the state by the rates measured before the transfer, but the rates at run time
differ (the receiver's CPU is shared by every stream, links change). So the fetch cuts each
source's share into requests of about ``piece_s`` seconds at that source's observed rate, keeps
a couple in flight per source, and when a source has nothing left to request it takes the tail
of the source predicted to finish last: just enough that both are predicted to finish together.
This module holds the arithmetic; :mod:`chaos_edge.replication.transfer.fetch` does the I/O.
"""

from __future__ import annotations

import math
from collections import deque

from chaos_edge.replication.planning.model import Range


class RateMeter:
    """An exponentially weighted estimate of one source's rate, in bytes per second.

    Both the bytes and the busy seconds decay with time constant ``tau_s``, so the estimate
    follows a rate that changes during the transfer. It starts from the plan's rate, weighted
    as ``prior_s`` seconds of observation, so the first few chunks do not swing it wildly.

    Args:
        prior_bps: The rate the plan assumed (bytes/s, > 0).
        tau_s: Time constant of the decay, in busy seconds.
        prior_s: Weight of the prior, in busy seconds.
    """

    def __init__(self, prior_bps: float, tau_s: float = 0.25, prior_s: float = 0.05) -> None:
        self.tau_s = tau_s
        self.bytes = prior_bps * prior_s
        self.busy_s = prior_s

    def add(self, nbytes: int, busy_s: float) -> None:
        """``nbytes`` arrived over ``busy_s`` seconds during which the source had work."""
        busy_s = max(busy_s, 0.0)
        keep = math.exp(-busy_s / self.tau_s)
        self.bytes = self.bytes * keep + nbytes
        self.busy_s = self.busy_s * keep + busy_s

    @property
    def rate(self) -> float:
        """Bytes per second."""
        return self.bytes / self.busy_s if self.busy_s > 0 else 0.0


def piece_bytes(rate: float, piece_s: float, lo: int, hi: int) -> int:
    """Size of the next request to a source of ``rate`` bytes/s: ``piece_s`` of its traffic."""
    return int(min(hi, max(lo, rate * piece_s)))


def cut_head(task: Range, size: int, align: int) -> tuple[Range, Range]:
    """Split ``size`` bytes off the front of ``task``: ``(piece, rest)`` (rest may be empty).

    A piece of at least ``align`` bytes ends on a multiple of ``align`` (a block boundary), so
    its blocks can be verified on their own.
    """
    off, length = task
    end = off + min(size, length)
    if end < off + length and size >= align and end - end % align > off:
        end -= end % align
    return (off, end - off), (end, off + length - end)


def steal_size(victim_left: int, victim_rate: float, thief_left: int, thief_rate: float) -> int:
    """Bytes the thief takes so that both are predicted to finish at the same time.

    ``*_left`` are the bytes each still has to receive (in flight and queued). Solves
    ``(victim_left - x) / victim_rate == (thief_left + x) / thief_rate`` for ``x``; zero when
    the thief would not finish before the victim anyway.
    """
    if victim_rate <= 0 or thief_rate <= 0:
        return 0
    x = (thief_rate * victim_left - victim_rate * thief_left) / (victim_rate + thief_rate)
    return max(0, int(x))


def take_tail(queue: deque[Range], nbytes: int, align: int) -> list[Range]:
    """Remove about ``nbytes`` from the end of ``queue`` (cut on a block boundary when the
    cut falls inside a range of more than one block); returns the ranges taken, in order."""
    taken: list[Range] = []
    while nbytes > 0 and queue:
        off, length = queue[-1]
        if length <= nbytes:
            taken.append(queue.pop())
            nbytes -= length
            continue
        cut = off + length - nbytes
        if length > align and cut % align:
            cut += align - cut % align  # take a little less, up to the next block boundary
        if cut < off + length:
            taken.append((cut, off + length - cut))
            queue[-1] = (off, cut - off)
        break
    return taken[::-1]
