"""The snapshot store: atomic, verified, and refusing what it cannot trust (issue 21).

Real files in a temp dir, a real model and optimizer captured through the Trainer's replica.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
import torch

from chaos_edge.replication.errors import ReplicationError
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.replica import Replica
from chaos_edge.trainer.snapshots import (
    SnapshotSettings,
    SnapshotStore,
    Snapshotter,
    SnapshotWriter,
    space_digest,
)
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.clock import FakeClock
from daemon.contracts.snapshots import newest_snapshot_step, snapshot_name

pytestmark = pytest.mark.timeout(60)


def replica(width: int = 4, seed: int = 0) -> Replica:
    torch.manual_seed(seed)
    model = torch.nn.Linear(3, width)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(2, 3)).sum().backward()
    opt.step()
    return Replica(model, opt, Registry(None, None), Stepper(model, opt))


def write(store: SnapshotStore, rep: Replica, step: int) -> Path:
    rep.step = step
    space = rep.snapshot()
    return store.write(space, space_digest(space)).path


def test_written_snapshots_load_back_newest_first_and_old_ones_go(tmp_path: Path) -> None:
    store, rep = SnapshotStore(tmp_path, "c1", keep=2), replica()
    for step in (100, 200, 300):
        write(store, rep, step)
    assert [p.name for p in store.snapshots()] == [snapshot_name(300), snapshot_name(200)]
    assert newest_snapshot_step(tmp_path) == 300
    other = replica(seed=1)
    snap, loaded = store.load_newest(other.fit_error) or pytest.fail("nothing loaded")
    other.restore(loaded)
    assert snap.step == other.step == 300
    assert other.digest() == rep.digest()  # bit-identical state


@pytest.mark.parametrize("damage", ["truncated", "corrupt", "foreign", "misfit", "garbage"])
def test_a_snapshot_it_cannot_trust_is_refused_in_one_line_and_the_next_is_used(
        tmp_path: Path, damage: str, caplog: pytest.LogCaptureFixture) -> None:
    store, rep = SnapshotStore(tmp_path, "c1", keep=5), replica()
    write(store, rep, 100)
    bad = write(store, rep, 200)
    data = bad.read_bytes()
    if damage == "truncated":
        bad.write_bytes(data[:-10])
    elif damage == "corrupt":
        bad.write_bytes(data[:-5] + bytes(b ^ 0xFF for b in data[-5:]))
    elif damage == "foreign":
        SnapshotStore(tmp_path, "another-cluster").write(rep.snapshot(), "x")  # step 200
    elif damage == "misfit":
        wide = replica(width=8)
        wide.step = 200
        store.write(wide.snapshot(), "x")
    else:
        bad.write_bytes(b"not a snapshot at all")
    with caplog.at_level(logging.WARNING, logger="chaos.snapshots"):
        snap, _ = store.load_newest(rep.fit_error) or pytest.fail("nothing loaded")
    assert snap.step == 100
    [line] = [r.getMessage() for r in caplog.records]
    assert str(bad) in line and "refused" in line and "\n" not in line
    assert bad.exists()  # kept for the operator: nothing is deleted for being unreadable


def test_nothing_old_is_deleted_when_a_write_fails(tmp_path: Path) -> None:
    store, rep = SnapshotStore(tmp_path, "c1", keep=1), replica()
    write(store, rep, 100)
    os.chmod(tmp_path, 0o500)  # read-only (CI runs as root, which ignores the mode)
    try:
        if os.geteuid() == 0:
            store.dir = tmp_path / "a-file"  # root: a directory that cannot be made instead
            store.dir.write_text("")
        with pytest.raises((OSError, ReplicationError)):
            write(store, rep, 200)
    finally:
        os.chmod(tmp_path, 0o700)
    assert newest_snapshot_step(tmp_path) == 100


def test_a_disk_that_refuses_stops_snapshots_with_one_report(tmp_path: Path) -> None:
    blocker = tmp_path / "snapshots"
    blocker.write_text("a file where the directory should be")
    said: list[str] = []
    writer = SnapshotWriter(SnapshotStore(blocker, "c1"), said.append)
    rep = replica()
    assert writer.submit(rep.snapshot(hashed=False))
    writer.flush(10)
    assert len(said) == 1 and str(blocker) in said[0]
    assert not writer.submit(rep.snapshot())  # stopped: training goes on without them
    writer.close()


def test_closing_a_writer_again_queues_nothing(tmp_path: Path) -> None:
    """A leave closes the Trainer, and so do a framework's teardown and atexit: a stop queued
    after the writer's thread has gone would fill the one-slot queue, and the next close
    would wait its whole timeout on it."""
    writer = SnapshotWriter(SnapshotStore(tmp_path, "c1"), lambda _reason: None)
    for _ in range(3):
        writer.close()
    assert writer._q.empty()


def _taken(folder: Path, every_steps: int, every_s: float, steps: range) -> list[int]:
    """The steps a snapshotter takes when ``steps`` commit one second apart."""
    clock, rep = FakeClock(), replica()
    snaps = Snapshotter(SnapshotSettings(str(folder), every_steps=every_steps, every_s=every_s),
                        "c1", rep, clock, lambda why: None)
    for step in steps:
        rep.step = step
        clock.advance(1.0)
        snaps.committed()
        snaps.writer.flush(10)
    snaps.close()
    return [s.step for s in snaps.writer.written]


def test_a_snapshot_is_due_once_every_steps_and_every_s_passed(tmp_path: Path) -> None:
    # 10 s apart: every tenth step is due.
    assert _taken(tmp_path / "a", 10, 5.0, range(1, 61)) == [10, 20, 30, 40, 50, 60]
    # 25 s passed (and 10 steps): due at once, not at the next multiple of 10 (30: a power
    # cut could cost every_s and every_steps more).
    assert _taken(tmp_path / "b", 10, 25.0, range(1, 61)) == [25, 50]
    # Steps of 7: 100 steps passed at 106 and 225, taken at the next multiples of 10.
    assert _taken(tmp_path / "c", 100, 5.0, range(1, 400, 7)) == [120, 260]


def test_a_restored_snapshot_is_the_step_the_join_says(tmp_path: Path) -> None:
    rep = replica()
    write(SnapshotStore(tmp_path, "c1"), rep, 700)
    fresh = replica(seed=3)
    snaps = Snapshotter(SnapshotSettings(str(tmp_path)), "c1", fresh, FakeClock(),
                        lambda why: None)
    assert snaps.restore() == 700 and fresh.digest() == rep.digest()
    snaps.close()
    empty = Snapshotter(SnapshotSettings(str(tmp_path / "none")), "c1", replica(), FakeClock(),
                        lambda why: None)
    assert empty.restore() == 0
    empty.close()
