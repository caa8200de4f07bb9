"""Where copies of the snapshots go, so that losing any ``copies`` boxes' disks loses nothing.

Each member writes its own snapshots, so a cluster of ``copies + 1`` members or more holds
the state of the last interval on that many disks already. With fewer (one member training
alone, say), the scheduler has a holder push its newest snapshot to boxes that do not train
(chaosd's shelf takes it; no worker is involved), until ``copies + 1`` boxes up hold one of the
last interval. Whole copies, not erasure-coded shards: an edge cluster short of members is
small, a shard scheme needs more boxes than it has, and a whole copy restores from one box.

After a power cut that took the members' disks (or left their newest snapshots behind), the
newest snapshot may be on a box that does not train. With no member left and joiners held
for a holder of the newest state (``Negotiator.held``), such a box is asked to push it to the
held joiner that holds the most, whose chaosd then restarts its worker: the worker restores
the newest snapshot on its disk when it starts, and asks to join holding it.

Pure logic: the negotiator feeds it what the heartbeats and presence said, and sends the
:class:`~daemon.contracts.protocol.CopySnapshot` commands it returns.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from daemon.contracts.clock import Clock
from daemon.contracts.protocol import CopySnapshot

log = logging.getLogger("chaosd.leader")

RETRY_S = 60.0  # a copy ordered and not seen on the target's disk by then is ordered again
# A box counts as one that does not train once no worker has been attached for this long: a
# crashed worker is restarted within seconds and restores that disk itself.
IDLE_S = 10.0


@dataclass(frozen=True)
class Box:
    """What the scheduler knows of one box that is up."""

    disk: int  # the newest snapshot on its disk (-1: none)
    worker: bool  # a worker is attached
    member: bool  # an active member
    shelf: str  # where its shelf listens, host:port ("" : none)


class Keepers:
    """The copies ordered and not yet seen, and the rules that order them."""

    def __init__(self, copies: int, every_steps: int, clock: Clock) -> None:
        self.copies, self.every_steps, self.clock = copies, every_steps, clock
        self._ordered: dict[str, tuple[int, float]] = {}  # target -> (step, when)
        self._idle_since: dict[str, float] = {}  # box -> since when no worker is attached

    def _pending(self, target: str, step: int) -> bool:
        got = self._ordered.get(target)
        return got is not None and got[0] >= step and \
            self.clock.monotonic() - got[1] < RETRY_S

    def _order(self, holder: str, step: int, target: str, box: Box,
               restore: bool = False) -> tuple[str, CopySnapshot]:
        self._ordered[target] = (step, self.clock.monotonic())
        return holder, CopySnapshot(step=step, to=target, addr=box.shelf, restore=restore)

    def observe(self, boxes: dict[str, Box]) -> None:
        """Note which boxes up have no worker, and since when."""
        now = self.clock.monotonic()
        for node, box in boxes.items():
            if box.worker:
                self._idle_since.pop(node, None)
            else:
                self._idle_since.setdefault(node, now)
        for node in [n for n in self._idle_since if n not in boxes]:
            del self._idle_since[node]

    def idle(self, node: str) -> bool:
        since = self._idle_since.get(node)
        return since is not None and self.clock.monotonic() - since >= IDLE_S

    def copies_due(self, boxes: dict[str, Box]) -> list[tuple[str, CopySnapshot]]:
        """While members train: copies of the newest member snapshot to boxes that do not
        train, until ``copies + 1`` boxes hold one of the last interval."""
        if self.copies <= 0:
            return []
        held = {n: b.disk for n, b in boxes.items() if b.member and b.disk > 0}
        if not held:
            return []
        newest = max(held.values())
        holder = min(n for n, s in held.items() if s == newest)
        fresh = {n for n, b in boxes.items() if b.disk >= newest - self.every_steps}
        fresh |= {n for n in boxes if self._pending(n, newest - self.every_steps)}
        need = self.copies + 1 - len(fresh)
        # Boxes that do not train (a worker attached may be one joining; its chaosd would
        # take a copy for a restore), by id, so that every scheduler picks the same ones.
        spare = sorted(n for n, b in boxes.items()
                       if n not in fresh and b.shelf and not b.worker and self.idle(n))
        return [self._order(holder, newest, n, boxes[n]) for n in spare[:max(0, need)]]

    def restore_due(self, boxes: dict[str, Box], held: dict[str, int]
                    ) -> list[tuple[str, CopySnapshot]]:
        """With no member: the newest snapshot is on a box that does not train and is newer
        than every held joiner's state; that box pushes it to the best held joiner."""
        joiners = [n for n in held if n in boxes and boxes[n].shelf]
        keepers = {n: b.disk for n, b in boxes.items()
                   if n not in held and not b.worker and self.idle(n) and b.disk > 0}
        if not joiners or not keepers:
            return []
        newest = max(keepers.values())
        best = max(joiners, key=lambda n: (held[n], boxes[n].disk, n))
        if newest <= max(held[best], boxes[best].disk) or self._pending(best, newest):
            return []
        keeper = min(n for n, s in keepers.items() if s == newest)
        log.warning("the newest snapshot (step %d) is on %s, which does not train: it goes "
                    "to %s, whose worker restores it", newest, keeper, best)
        return [self._order(keeper, newest, best, boxes[best], restore=True)]
