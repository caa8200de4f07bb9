"""chaosd's side of the snapshot copies: the shelf that takes them, the pushes the scheduler
orders (:class:`~daemon.contracts.protocol.CopySnapshot`), and the restart of a held worker
once a copy to restore from has landed (the rules are :mod:`daemon.cluster.keepers`')."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from pathlib import Path

from daemon.agent.shelf import Shelf, ShelfError, push_snapshot, shelf_key
from daemon.contracts.clock import Clock
from daemon.contracts.config import Config
from daemon.contracts.protocol import CopySnapshot
from daemon.contracts.ratelog import RateLimitedLog
from daemon.contracts.snapshots import SNAPSHOT_DIR, newest_snapshot_step, snapshot_name

log = logging.getLogger("chaosd.copies")
FAIL_LOG_S = 30.0  # at most one line per this long about pushes that failed


class SnapshotCopies:
    """The shelf of this box, and the copies it pushes to others' (one in flight per box).

    Args:
        cfg: chaosd's config (data dir, secret, cluster, ``[snapshots]``, advertised address).
        clock: For the rate-limited log.
        restore: Called with the step of a copy that landed for this box's worker to restore
            (the agent restarts a held worker; see :meth:`NodeAgent.restore_from_copy`).
    """

    def __init__(self, cfg: Config, clock: Clock, restore: Callable[[str, int], None]) -> None:
        self.dir = Path(cfg.data_dir) / SNAPSHOT_DIR
        self._key = shelf_key(cfg.secret or f"chaos-default-secret:{cfg.cluster}", cfg.cluster)
        self._me = cfg.node_id
        self._restore = restore
        self.shelf = Shelf(self.dir, self._key, cfg.cluster, cfg.snapshots.keep,
                           cfg.advertise, cfg.snapshots.port, received=self._received)
        self._pushes: dict[str, asyncio.Task[None]] = {}
        self.pushed = 0  # copies sent, for the metrics and the tests
        self._failures = RateLimitedLog(log, "%d snapshot copies failed; last: %s", clock,
                                        FAIL_LOG_S)

    @property
    def port(self) -> int:
        return self.shelf.port

    async def start(self) -> None:
        await self.shelf.start()

    async def close(self) -> None:
        for task in self._pushes.values():
            task.cancel()
        await asyncio.gather(*self._pushes.values(), return_exceptions=True)
        self._pushes.clear()
        await self.shelf.close()

    def order(self, cmd: CopySnapshot) -> None:
        """Push our snapshot of ``cmd.step`` (or the newest, if that one was pruned) to
        ``cmd.to``, unless a push to it is still in flight."""
        busy = self._pushes.get(cmd.to)
        if busy is not None and not busy.done():
            return
        self._pushes[cmd.to] = asyncio.create_task(self._push(cmd), name=f"copy-{cmd.to}")

    async def _push(self, cmd: CopySnapshot) -> None:
        path = self.dir / snapshot_name(cmd.step)
        if not path.exists():
            newest = newest_snapshot_step(self.dir)
            if newest < cmd.step:
                self._failures.note(f"to {cmd.to}: no snapshot of step {cmd.step} here")
                return
            path = self.dir / snapshot_name(newest)
        host, _, port = cmd.addr.rpartition(":")
        try:
            sent = await push_snapshot(path, host.strip("[]"), int(port), self._key, self._me,
                                       restore=cmd.restore)
        except ShelfError as exc:
            self._failures.note(f"to {cmd.to}: {exc}")
            return
        self.pushed += 1
        log.info("copied the snapshot %s to %s (%d bytes)%s", path.name, cmd.to, sent,
                 " for its worker to restore" if cmd.restore else "")

    def _received(self, sender: str, step: int, restore: bool) -> None:
        log.info("%s left a copy of its snapshot of step %d here%s", sender, step,
                 ": the worker restores it" if restore else "")
        if restore:
            self._restore(sender, step)
