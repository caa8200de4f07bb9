"""Consistent rounds under fault injection, with real worker processes and a fake daemon.

Four Trainer processes train a small model on a chain (root n1). One or two of them SIGKILL
themselves at a chosen data-plane event (reduce, broadcast, ack, commit, agreement); the fake
plays chaosd's supervisor (a worker that exits while attached is dropped at once). Every
survivor must finish, at the same final step, with bit-identical parameters and optimizer
state at every step they both committed, and the loss must fall. Two faults that need no
particular state of the other share a run, seven rounds apart (four workers' start is most
of a run's CPU).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from tests.training._fake import FakeCluster, spawn_worker

pytestmark = pytest.mark.timeout(120)
IDS = ["n0", "n1", "n2", "n3"]
STEPS = 20
WORKER = str(Path(__file__).with_name("_worker.py"))


def _start(tmp_path: Path, fake: FakeCluster, procs: list[subprocess.Popen[bytes]],
           extra: dict[str, list[str]]) -> dict[str, subprocess.Popen[bytes]]:
    """The four workers, one by one as boxes join; ``extra``: a node's added arguments."""
    mine: dict[str, subprocess.Popen[bytes]] = {}
    for node in IDS:
        argv = [sys.executable, WORKER, "--steps", str(STEPS), "--wait-members", "4",
                "--out", str(tmp_path / f"{node}.jsonl"), *extra.get(node, [])]
        log = open(tmp_path / f"{node}.log", "wb")  # noqa: SIM115 - closed with the process
        p = spawn_worker(argv, fake, node, log)
        procs.append(p)
        mine[node] = p
        time.sleep(0.3)
    return mine


def _run(tmp_path: Path, procs: list[subprocess.Popen[bytes]], faults: dict[str, str]) -> None:
    fake = FakeCluster(tmp_path)
    try:
        mine = _start(tmp_path, fake, procs, {n: ["--fault", f] for n, f in faults.items()})
        deadline = time.monotonic() + 90
        while any(p.poll() is None for p in mine.values()):  # the fake drops the dead
            assert time.monotonic() < deadline, "workers did not finish"
            time.sleep(0.05)
    finally:
        fake.close()
    survivors = [n for n in IDS if n not in faults]
    for node in IDS:
        rc = mine[node].returncode
        assert (rc == -9) if node in faults else (rc == 0), (node, rc,
                                                            (tmp_path / f"{node}.log").read_text())
    rows = {n: [json.loads(x) for x in (tmp_path / f"{n}.jsonl").read_text().splitlines()]
            for n in survivors}
    by_step: dict[int, set[str]] = {}
    for node in survivors:
        assert rows[node][-1]["step"] == STEPS
        for r in rows[node]:
            by_step.setdefault(r["step"], set()).add(r["digest"])
    diverged = {s: d for s, d in by_step.items() if len(d) > 1}
    assert not diverged, f"survivors differ at steps {sorted(diverged)}"
    losses = [r["loss"] for r in rows[survivors[0]]]
    assert sum(losses[-5:]) < sum(losses[:5])


@pytest.mark.parametrize(
    "faults",
    [
        # A leaf dies mid-reduce (nobody holds a result); later, on the chain n0 - n1 - n2
        # left, the root dies mid-broadcast (some hold part of it).
        {"n3": "reduce:1:5", "n1": "bcast:1:12"},
        # The root sent every chunk (all hold it, none committed); later, on n0 - n2 - n3, a
        # leaf acks, then dies (the round commits without it).
        {"n1": "bcast:2:5", "n3": "ack:0:12"},
        {"n1": "commit:0:5"},  # the root commits to n0 only: n2 and n3 are uncertain
        {"n1": "commit:0:5", "n2": "agree-down:0:5"},  # then the new root dies mid-agreement
    ],
    ids=["reduce-then-bcast-partial", "bcast-all-then-ack", "commit", "commit-then-agree"],
)
def test_survivors_stay_bit_identical(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]], faults: dict[str, str]
) -> None:
    _run(tmp_path, procs, faults)


def _rows(path: Path) -> list[dict[str, object]]:
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


def _wait(what: str, ready: Callable[[], bool], procs: dict[str, subprocess.Popen[bytes]],
          tmp_path: Path) -> None:
    deadline = time.monotonic() + 120  # a hang guard only: a loaded box is slow, not wrong
    while not ready():
        dead = {n: p.returncode for n, p in procs.items() if p.poll() not in (None, 0)}
        logs = {n: (tmp_path / f"{n}.log").read_text()[-2000:] for n in dead}
        assert not dead and time.monotonic() < deadline, (what, dead, logs)
        time.sleep(0.05)


@pytest.mark.timeout(400)
def test_a_frozen_root_that_commits_after_its_members_moved_on_agrees_with_them(
    tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> None:
    """Soak fault 19: the root froze at its commit point of round 5, holding every ACK; the
    scheduler dropped it and the others, uncertain, opened a new epoch without it. Thawed,
    the root committed round 5. The others must have applied that same result, not rerun
    the round without the root's gradient: one round, one result, wherever it committed."""
    fake = FakeCluster(tmp_path)
    try:  # n1 is the root of the chain n0 - n1 - n2 - n3
        mine = _start(tmp_path, fake, procs, {"n1": ["--freeze", "committed:0:5"]})
        root = psutil.Process(mine["n1"].pid)
        _wait("the root to freeze", lambda: root.status() == psutil.STATUS_STOPPED, mine,
              tmp_path)
        fake.fail("n1")  # the failure detector's verdict on a box that went silent
        others = [n for n in IDS if n != "n1"]
        _wait("the others to train on without the root",
              lambda: all(any(r["step"] == 7 for r in _rows(tmp_path / f"{n}.jsonl"))
                          for n in others), mine, tmp_path)
        mine["n1"].send_signal(signal.SIGCONT)
        _wait("the thawed root to commit round 5",
              lambda: any(r["step"] == 5 for r in _rows(tmp_path / "n1.jsonl")),
              mine, tmp_path)
        mine["n1"].kill()  # it asked to rejoin (it is outside the policy): that is not
        mine["n1"].wait(10)  # this test's subject (the fake drops it, as chaosd would)
        del mine["n1"]
        _wait("the others to finish", lambda: all(p.poll() is not None for p in mine.values()),
              mine, tmp_path)
    finally:
        fake.close()
    assert all(p.returncode == 0 for p in mine.values()), {n: p.returncode for n, p in
                                                            mine.items()}
    digests: dict[int, set[object]] = {}
    for node in IDS:
        for r in _rows(tmp_path / f"{node}.jsonl"):
            step = int(str(r["step"]))
            # Past round 5 the root is a cluster of its own: once the others finished and
            # were dropped, its rejoin found nobody and it went on alone from its state.
            if node != "n1" or step <= 5:
                digests.setdefault(step, set()).add(r["digest"])
    assert len(digests[5]) == 1, "the root's round 5 and the others' differ"
    assert all(len(d) == 1 for d in digests.values()), digests
    assert max(digests) == STEPS
