"""A site-wide power cut loses at most one snapshot interval (issue 21).

Real mosquitto (it stays up, as a gateway's would), real chaosd processes, real workers.
Every daemon and every worker is killed at the same moment, then the daemons are started
again on the same data dirs, as systemd does when the power is back. Nobody runs
``chaosctl join``: each daemon starts its remembered job, each worker loads the newest
snapshot of its box and asks to join holding its step, and the cluster goes on from the
newest one, saying so with a ``state-restored`` event.
"""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path
from typing import Any

import pytest

from chaos_edge.trainer.snapshots import SnapshotStore
from daemon.agent.worker import pid_alive

pytestmark = pytest.mark.timeout(240)

EVERY_STEPS = 20
CONFIG = f"[snapshots]\nevery_steps = {EVERY_STEPS}\nevery_s = 0.5\n"


def snapshot_steps(r: Any, node: str) -> list[int]:
    store = SnapshotStore(Path(r.c.workdir) / node / "snapshots", "train")
    return sorted(int(p.name[5:17]) for p in store.snapshots())


def power_cut(r: Any, ids: list[str]) -> None:
    """Every worker and every daemon at once, SIGKILL: no leave, no last word."""
    pids = [r.worker_pid(n) for n in ids]
    for pid in pids:
        if pid:
            os.killpg(pid, signal.SIGKILL)
    for n in ids:
        r.c.kill(n, signal.SIGKILL)
    r.c.wait(lambda: not any(pid_alive(p) for p in pids if p), 30, "every worker gone")


def rows_after(r: Any, node: str, mark: int) -> list[dict[str, Any]]:
    return r.records(node)[mark:]


def test_a_power_cut_of_every_box_resumes_from_the_newest_snapshot(run: Any) -> None:
    r = run(3, config=CONFIG)
    ids = r.c.node_ids
    newest, marks, reached = _cut_and_return(r, ids, ids)
    first = _identical_after(r, ids, marks)
    # The cluster went on from the newest snapshot any box held: nothing older, nothing fresh.
    assert first == newest + 1, (first, newest, reached)
    assert reached - newest <= 2 * EVERY_STEPS, (reached, newest)  # at most an interval or so
    _restored_at(r, ids[0], newest)


def test_a_power_cut_that_takes_the_broker_too_resumes_from_the_newest_snapshot(
        run: Any) -> None:
    # The gateway lost power too: mosquitto (no persistence) comes back empty, with no
    # retained claim nor cluster view. A box waits the orphan delay before it stands (its
    # snapshot may be stale beside peers still reconnecting), then the newest snapshot is
    # restored, and the event says so though nobody knows any more how many steps it cost.
    r = run(3, config=CONFIG)
    ids = r.c.node_ids
    newest, marks, _ = _cut_and_return(r, ids, ids, broker=True)
    first = _identical_after(r, ids, marks)
    assert first == newest + 1
    _restored_at(r, ids[0], newest)


def _cut_and_return(r: Any, ids: list[str], back: list[str], wiped: str = "",
                    broker: bool = False) -> tuple[int, dict[str, int], int]:
    """Train past a few snapshots, cut the power of every box (and of the broker's, if
    ``broker``), wipe ``wiped``'s data dir, and bring back only ``back``; returns the newest
    snapshot of the boxes that came back, the row marks of every box and the newest step
    trained before the cut."""
    r.join_all(ids)
    r.advance(ids, 3 * EVERY_STEPS)
    r.c.wait(lambda: all(snapshot_steps(r, n) for n in ids), 60, "a snapshot on every box")
    power_cut(r, ids)
    if broker:
        r.c.stop_broker(signal.SIGKILL)
        r.c.start_broker()
    reached = max(r.step(n) for n in ids)
    if wiped:  # the box's disk was replaced: no snapshot, no remembered job
        shutil.rmtree(Path(r.c.workdir) / wiped)
        (Path(r.c.workdir) / wiped).mkdir()
    held = [max(steps) for n in back if (steps := snapshot_steps(r, n))]
    marks = {n: len(r.records(n)) for n in ids}
    for n in back:
        r.c.start_node(n)  # the power is back; no `chaosctl join`
    return max(held), marks, reached


def _identical_after(r: Any, nodes: list[str], marks: dict[str, int]) -> int:
    """The first step trained after the restore, once every box in ``nodes`` trains the
    same states again."""
    r.c.wait(lambda: all(len(r.records(n)) > marks[n] + 5 for n in nodes), 120,
             f"training to resume on {nodes}")
    by_step: dict[int, set[str]] = {}
    for n in nodes:
        for row in rows_after(r, n, marks[n]):
            by_step.setdefault(row["step"], set()).add(row["digest"])
    assert all(len(d) == 1 for d in by_step.values()), "members differ after the restore"
    return min(by_step)


def test_a_box_whose_disk_was_wiped_rejoins_from_the_others_snapshot(run: Any) -> None:
    r = run(3, config=CONFIG)
    ids = r.c.node_ids
    wiped = ids[0]  # the first box: the scheduler's seat before the cut
    newest, marks, _ = _cut_and_return(r, ids, ids, wiped=wiped)
    r.c.wait(lambda: r.c.query(wiped, "ping"), 30, f"{wiped}'s chaosd up")
    r.join(wiped)  # a new disk remembers no job: its owner joins again
    first = _identical_after(r, ids, marks)
    assert first == newest + 1
    _restored_at(r, ids[-1], newest)


def test_the_boxes_that_return_restore_without_the_one_that_does_not(run: Any) -> None:
    r = run(3, config=CONFIG)
    ids = r.c.node_ids
    back = ids[1:]
    newest, marks, _ = _cut_and_return(r, ids, back)
    first = _identical_after(r, back, marks)
    assert first == newest + 1  # the newest snapshot of those that came back
    _restored_at(r, back[-1], newest)


def _restored_at(r: Any, asker: str, step: int) -> None:
    restored = r.c.wait(lambda: r.c.events(asker, "state-restored"), 30,
                        "a state-restored event")
    assert restored[-1]["step"] == step and not r.c.events(asker, "state-lost")


def test_a_lone_members_snapshot_kept_by_a_box_that_does_not_train_outlives_its_disk(
        run: Any) -> None:
    # `[snapshots] copies = 1`: one member trains alone, so the scheduler has it push its
    # snapshots to the other box, whose chaosd runs no job. A power cut, and the member's
    # disk is replaced: the copy is all that is left. The member's worker, joined again by
    # its owner, is held (a newer snapshot is up), the copy is pushed to its box, and its
    # chaosd restarts the job, which restores it.
    r = run(2, config=CONFIG)
    member, keeper = r.c.node_ids
    r.join(member)
    r.c.wait(lambda: r.active([member]), 60, f"{member} active")
    r.advance([member], 3 * EVERY_STEPS)
    r.c.wait(lambda: snapshot_steps(r, keeper), 60, f"a copy on {keeper}'s disk")
    power_cut(r, [member, keeper])
    kept = max(snapshot_steps(r, keeper))
    shutil.rmtree(Path(r.c.workdir) / member)
    (Path(r.c.workdir) / member).mkdir()
    mark = len(r.records(member))
    for n in (member, keeper):
        r.c.start_node(n)
    r.c.wait(lambda: r.c.query(member, "ping"), 30, f"{member}'s chaosd up")
    r.join(member)
    r.c.wait(lambda: len(r.records(member)) > mark + 5, 120, "training to resume")
    assert rows_after(r, member, mark)[0]["step"] == kept + 1
    _restored_at(r, member, kept)
