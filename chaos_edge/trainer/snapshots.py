"""Durable snapshots: the agreed state of a step boundary, on this box's disk.

A member's state lives in its worker's memory; a site-wide power cut takes every copy at
once. Each member therefore writes the state of a committed step to chaosd's data dir now and
then, and a worker that starts (the daemon came back and started its remembered job) loads the
newest snapshot that verifies and fits before it asks to join, so the join says which step it
holds and the scheduler restarts the cluster from the best state the returning boxes have.

The capture (one copy of the state, the same one a source makes for a new node) is on the
step's path; hashing and writing are not: one background thread does them, one snapshot in
flight at most (a snapshot that comes due while one is still being written is skipped).

File format (``snap-<step>.chaos``): one JSON line (the header: format, cluster, step, the
state's digest as the divergence guard computes it, and the block manifest), then the state's
bytes. Written to a temporary file in the same directory, fsynced, renamed, and the directory
fsynced, so a power cut leaves the old snapshot or the new one, never half of one. Loading
verifies every block against the manifest and the state's fit to this script's model; a
snapshot that fails is refused in one line naming the file and the reason, and the next one
is tried. Old snapshots are deleted only once a newer one has been written and read back.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from chaos_edge.replication.errors import ReplicationError
from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.manifest import digest as block_digest
from chaos_edge.replication.state import Loaded, StateSpace
from chaos_edge.trainer.replica import Replica
from daemon.contracts.clock import Clock
from daemon.contracts.snapshots import PREFIX, SUFFIX, snapshot_name, snapshot_step

log = logging.getLogger("chaos.snapshots")

FORMAT = "chaos-snapshot/1"
MAX_HEADER = 1 << 26  # a manifest of a very large state: 64 MiB of JSON at most


@dataclass(frozen=True)
class SnapshotSettings:
    """When and where a member snapshots (chaosd's ``[snapshots]``, sent in ``ping``).

    A snapshot comes due once both ``every_steps`` steps and ``every_s`` seconds have passed
    since the last one (taken at the next multiple of :attr:`align` steps): a power cut then
    costs at most the larger of the two, plus ``align`` steps and the time to write one.
    """

    directory: str = ""  # empty: off
    every_steps: int = 100
    every_s: float = 10.0
    keep: int = 3

    @property
    def align(self) -> int:
        """Snapshots are taken at multiples of this many steps (a tenth of the interval)."""
        return max(1, self.every_steps // 10)

    @classmethod
    def from_reply(cls, doc: Any) -> SnapshotSettings:
        """From the daemon's ``ping`` reply (``snapshots``); anything malformed turns it off."""
        if not isinstance(doc, dict):
            return cls()
        try:
            return cls(str(doc.get("dir") or ""), max(1, int(doc.get("every_steps", 100))),
                       max(0.0, float(doc.get("every_s", 10.0))), max(1, int(doc.get("keep", 3))))
        except (TypeError, ValueError):
            log.warning("chaosd sent malformed snapshot settings %r; not snapshotting", doc)
            return cls()


@dataclass(frozen=True)
class Snapshot:
    """One snapshot file, its header read."""

    path: Path
    step: int
    digest: str
    cluster: str
    manifest: Manifest
    offset: int  # where the state's bytes begin


class SnapshotStore:
    """The snapshots of one box's data dir, for one cluster.

    Args:
        directory: Where they live (created on the first write).
        cluster: The cluster's name: a snapshot of another cluster is refused.
        keep: How many verified snapshots to keep.
    """

    def __init__(self, directory: str | os.PathLike[str], cluster: str, keep: int = 3) -> None:
        self.dir, self.cluster, self.keep = Path(directory), cluster, max(1, keep)

    # --- writing ------------------------------------------------------------------------
    def write(self, space: StateSpace, digest: str) -> Snapshot:
        """Write ``space`` (its step: the manifest's version) atomically, read it back, then
        delete the oldest beyond ``keep``.

        Raises:
            OSError: The disk refused (full, read-only): nothing older was deleted.
            ReplicationError: The file read back does not verify.
        """
        m = space.manifest
        header = json.dumps({"format": FORMAT, "cluster": self.cluster, "step": m.version,
                             "digest": digest, "manifest": m.to_dict()},
                            sort_keys=True).encode() + b"\n"
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.dir / snapshot_name(m.version)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            with open(tmp, "wb") as f:
                f.write(header)
                f.write(space.buffer)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
        self._sync_dir()
        snap = self._verified(path)
        self._prune(newest=snap)
        return snap

    def _sync_dir(self) -> None:
        fd = os.open(self.dir, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    def _verified(self, path: Path) -> Snapshot:
        """Read ``path`` back block by block against its manifest (one block in memory at a
        time: a second copy of a large state is what the write must not cost).

        Raises:
            ReplicationError: A block differs, or the file is short.
        """
        snap = self.read_header(path)
        m = snap.manifest
        with open(path, "rb") as f:
            f.seek(snap.offset)
            for i, want in enumerate(m.blocks):
                if block_digest(f.read(m.block_size)) != want:
                    raise ReplicationError(f"block {i} differs from what was written")
        return snap

    def _prune(self, newest: Snapshot) -> None:
        """Delete all but the ``keep`` newest, never ``newest`` (just verified), and temporary
        files a power cut left behind."""
        for stale in self.dir.glob(f".{PREFIX}*{SUFFIX}.tmp"):
            with contextlib.suppress(OSError):
                stale.unlink()
        for old in self.snapshots()[self.keep:]:
            if old != newest.path:
                with contextlib.suppress(OSError):
                    old.unlink()

    # --- reading ------------------------------------------------------------------------
    def read_header(self, path: Path) -> Snapshot:
        """Parse ``path``'s header.

        Raises:
            ReplicationError: Not a snapshot of this format and cluster, or truncated.
        """
        try:
            with open(path, "rb") as f:
                line = f.readline(MAX_HEADER)
                size = os.fstat(f.fileno()).st_size
        except OSError as exc:
            raise ReplicationError(f"cannot read it: {exc.strerror or exc}") from None
        if not line.endswith(b"\n"):
            raise ReplicationError("no header: not a snapshot, or truncated")
        try:
            doc = json.loads(line)
            if not isinstance(doc, dict) or doc.get("format") != FORMAT:
                raise ReplicationError(f"not a {FORMAT} file")
            manifest = Manifest.from_dict(doc["manifest"])
            step, digest, cluster = int(doc["step"]), str(doc["digest"]), str(doc["cluster"])
        except (ValueError, KeyError, TypeError) as exc:
            raise ReplicationError(f"malformed header: {exc!r}") from None
        if cluster != self.cluster:
            raise ReplicationError(f"from cluster {cluster!r}, not {self.cluster!r}")
        if step != manifest.version:
            raise ReplicationError(f"header says step {step}, its manifest {manifest.version}")
        if size - len(line) != manifest.total_bytes:
            raise ReplicationError(f"truncated: {size - len(line)} of {manifest.total_bytes} "
                                   "bytes of state")
        return Snapshot(path, step, digest, cluster, manifest, len(line))

    @staticmethod
    def _body(snap: Snapshot) -> bytes:
        with open(snap.path, "rb") as f:
            f.seek(snap.offset)
            return f.read()

    def snapshots(self) -> list[Path]:
        """The snapshot files, newest step first."""
        if not self.dir.is_dir():
            return []
        return sorted((p for p in self.dir.iterdir() if snapshot_step(p) is not None),
                      reverse=True)

    def load_newest(self, fits: Callable[[Loaded], str | None]
                    ) -> tuple[Snapshot, Loaded] | None:  # fmt: skip
        """The newest snapshot that verifies and fits (``fits``: why a state does not fit
        this script, or None), or None. Each one refused is logged in one line, naming the
        file and the reason, and kept (the operator may want it)."""
        for path in self.snapshots():
            try:
                snap = self.read_header(path)
                loaded = StateSpace.load(snap.manifest, self._body(snap))
            except (ReplicationError, OSError) as exc:
                log.warning("snapshot %s refused: %s", path, exc)
                continue
            why = fits(loaded)
            if why is not None:
                log.warning("snapshot %s refused: it does not fit this script: %s", path, why)
                continue
            return snap, loaded
        return None


class SnapshotWriter:
    """Writes snapshots on a thread of its own, one at a time.

    A write that fails (a full or read-only disk) stops snapshotting: ``on_error`` is called
    once with the reason, and training goes on.

    Args:
        store: Where they go.
        on_error: Called once, on the writer's thread, when a write fails.
    """

    def __init__(self, store: SnapshotStore, on_error: Callable[[str], None]) -> None:
        self.store, self._on_error = store, on_error
        self._q: queue.Queue[StateSpace | None] = queue.Queue(maxsize=1)
        self.written: list[Snapshot] = []
        self.failed: str | None = None
        self._thread = threading.Thread(target=self._run, name="chaos-snapshots", daemon=True)
        self._thread.start()

    def submit(self, space: StateSpace) -> bool:
        """Queue ``space`` for writing (hashed here, if it is not yet); False (and nothing
        queued) while one is in flight or after a failure."""
        if self.failed is not None or self.busy():
            return False
        try:
            self._q.put_nowait(space)
        except queue.Full:
            return False
        return True

    def busy(self) -> bool:
        return self._q.unfinished_tasks > 0

    def _run(self) -> None:
        while True:
            item = self._q.get()
            try:
                if item is None:
                    return
                space = item.hashed()
                item = None  # the state's copy goes as soon as it is written, not at the next
                try:
                    self.written.append(self.store.write(space, space_digest(space)))
                    del self.written[:-16]
                except (OSError, ReplicationError) as exc:
                    self.failed = f"{self.store.dir}: {exc}"
                    log.error("snapshot of step %d failed, snapshots stop: %s",
                              space.manifest.version, self.failed)
                    self._on_error(self.failed)
                finally:
                    del space
            finally:
                self._q.task_done()

    def flush(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for the snapshot in flight."""
        done = threading.Event()

        def waiter() -> None:
            self._q.join()
            done.set()

        threading.Thread(target=waiter, daemon=True).start()
        done.wait(timeout)

    def close(self, timeout: float = 30.0) -> None:
        """Finish the snapshot in flight (a leave or an exit keeps it), then stop. Once
        stopped, at once: nothing would take a second stop from the queue."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self._q.put(None, timeout=timeout)
        self._thread.join(timeout)


def space_digest(space: StateSpace) -> str:
    """A digest of a captured state, from its block digests (already computed): members that
    hold the same state at the same step write the same one."""
    return hashlib.sha256("".join(space.manifest.blocks).encode()).hexdigest()


class Snapshotter:
    """A member's snapshots: the newest one loaded when the worker starts, and one taken after
    a committed round whenever one is due (:class:`SnapshotSettings`).

    Args:
        settings: chaosd's ``[snapshots]``.
        cluster: The cluster's name (a snapshot of another one is refused).
        replica: The state (captured from, restored into).
        clock: The time source of the schedule.
        failed: Called once, from the writer's thread, when the disk refuses a write.
    """

    def __init__(self, settings: SnapshotSettings, cluster: str, replica: Replica,
                 clock: Clock, failed: Callable[[str], None]) -> None:
        self.settings, self._replica, self._clock = settings, replica, clock
        self.store = SnapshotStore(settings.directory, cluster, settings.keep)
        self.writer = SnapshotWriter(self.store, failed)
        self._last = (replica.step, clock.monotonic())  # (step, when) of the last one taken
        self.restored: Snapshot | None = None

    def restore(self) -> int:
        """Load the newest snapshot that verifies and fits; its step (0: none, a fresh model)."""
        found = self.store.load_newest(self._replica.fit_error)
        if found is None:
            return 0
        snap, loaded = found
        self._replica.restore(loaded)
        self._replica.start_alone()  # a held result is not settled by anyone after a restart
        self.restored = snap
        self._last = (snap.step, self._clock.monotonic())
        log.warning("restored the state of step %d from %s", snap.step, snap.path)
        return snap.step

    def committed(self) -> None:
        """After a committed round: take a snapshot if one is due and the writer is free.

        Due once ``every_steps`` steps and ``every_s`` seconds have passed since the last
        one, at the next multiple of :attr:`SnapshotSettings.align` steps, so the members
        snapshot the same steps and the newest one is on several boxes. (Multiples of
        ``every_steps`` itself, as before, let a power cut cost ``every_s`` plus up to
        ``every_steps`` more: 159 steps where one interval was 103, in the soak.)"""
        step, now = self._replica.step, self._clock.monotonic()
        last_step, last_at = self._last
        cfg = self.settings
        if (step % cfg.align or step - last_step < cfg.every_steps
                or now - last_at < cfg.every_s or self.writer.busy()):
            return
        if self.writer.submit(self._replica.snapshot(hashed=False)):  # hashed by the writer
            self._last = (step, now)

    def close(self) -> None:
        self.writer.close()
