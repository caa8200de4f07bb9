"""Fences: which phases a newer sync policy has made pointless.

Round ``s`` runs under the newest policy whose ``effective_step <= s``
(docs/training-protocol.md). Once a node knows that policy ``v`` takes effect at step ``e``, a
phase of an older version for a round ``>= e`` can never commit usefully: its epoch is over,
and after a failure it waits for a peer that is gone. :meth:`AllReducer.supersede` records a
fence per such policy and aborts those phases, the one in flight and any started later (the
Trainer may start a round in the moment before it takes in the policy its poller fetched).
"""

from __future__ import annotations

from chaos_edge.dataplane.rounds import Phase

KEEP = 16  # fences of recent versions; an older phase is also older than these


class Fences:
    """Policy version -> the first round it governs, for the newest few versions."""

    def __init__(self) -> None:
        self._from: dict[int, int] = {}

    def add(self, version: int, from_step: int) -> None:
        """Policy ``version`` governs rounds from ``from_step`` on."""
        self._from[version] = min(from_step, self._from.get(version, from_step))
        for old in sorted(self._from)[:-KEEP]:
            del self._from[old]

    def over(self, ph: Phase) -> tuple[int, int] | None:
        """``(version, from_step)`` of a newer policy that governs ``ph``'s round, or None."""
        for version in sorted(self._from, reverse=True):
            if version <= ph.version:
                return None
            if self._from[version] <= ph.round_step:
                return version, self._from[version]
        return None
