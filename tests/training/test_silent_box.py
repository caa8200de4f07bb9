"""A box that goes silent (daemon and worker SIGSTOPped, no TCP reset) costs seconds, not a
round timeout.

Three real chaosd nodes on mosquitto, each with a real worker, train together with the default
settings. One whole box is frozen, the way a power cut or a lost Wi-Fi looks to its peers: a
member, or the scheduler's own box (then the survivors also elect a new scheduler). The failure
detector declares it failed, the scheduler publishes the policy without it effective at once,
and the survivors must abort the round in flight and rerun it: issue 8 asks for a step under
the new policy within 3 s of the freeze, detection included. The tests print that time (the
figure in BENCHMARKS.md) and assert what must happen, in order, not a wall-clock bound. The
survivors' states stay bit-identical.

A second test freezes the root of a chain of three workers behind the fake daemon, which
declares the failure at once: the abort and the new tree edge alone, without detection.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.training._fake import FakeCluster, spawn_worker
from tests.training._run import WORKER

Rows = list[dict[str, Any]]

pytestmark = pytest.mark.timeout(180)
POLL_EVERY_S = 0.01  # how often the test reads the survivors' step records


def _resumed_at(records: Callable[[str], Rows], nodes: list[str], version: int,
                timeout: float) -> dict[str, float]:  # fmt: skip
    """``time.monotonic()`` at which each node's records first show a step committed under a
    policy newer than ``version`` (read every POLL_EVERY_S)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout
    while len(seen) < len(nodes) and time.monotonic() < deadline:
        for n in nodes:
            if n not in seen and any(row.get("policy_version", 0) > version
                                     for row in records(n)[-20:]):
                seen[n] = time.monotonic()
        time.sleep(POLL_EVERY_S)
    return seen


def _rows(path: Path) -> Rows:
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


@pytest.mark.parametrize("box", ["member", "scheduler"])
def test_survivors_step_within_3s_of_a_silent_box(run: Any, box: str) -> None:
    r = run(3)
    r.join_all(r.c.node_ids)
    r.advance(r.c.node_ids, 20)
    sched, _ = r.c.wait(lambda: r.c.agreed(), 20, "one scheduler")
    victim = sched if box == "scheduler" else max(n for n in r.c.node_ids if n != sched)
    survivors = [n for n in r.c.node_ids if n != victim]
    worker = r.worker_pid(victim)
    assert worker, f"{victim} reported no worker"
    before = max(row.get("policy_version", 0) for n in survivors for row in r.records(n))
    try:
        frozen = time.monotonic()
        r.c.kill(victim, signal.SIGSTOP)  # the daemon's group, then the worker's
        os.killpg(worker, signal.SIGSTOP)
        seen = _resumed_at(r.records, survivors, before, 60)
        took = {n: round(t - frozen, 3) for n, t in seen.items()}
        print(f"\nfroze {victim} (scheduler {sched}); freeze to the first step under the "
              f"new policy: {took}")
        assert set(seen) == set(survivors), f"survivors did not resume in 60 s: {took}"
        failed = r.c.wait(lambda: [e for e in r.c.events(survivors[0], "node-failed")
                                   if e["node"] == victim], 10, f"{victim} declared failed")
        assert failed
        # No wall-clock bound here (a loaded box breaks it): the time is printed, and
        # BENCHMARKS.md reports it against issue 8's 3 s goal.
        r.advance(survivors, 10)
    finally:
        # A stopped process must not linger: kill the frozen box (SIGKILL works on it).
        r.c.kill(victim, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(worker, signal.SIGKILL)
    rows = {n: r.records(n) for n in survivors}
    assert all(row["reruns"] <= 3 for n in survivors for row in rows[n]), "rerun storm"
    r.assert_consistent()


def test_survivors_rerun_at_once_when_the_root_of_their_tree_freezes(
        tmp_path: Path, procs: list[subprocess.Popen[bytes]]) -> None:
    fake = FakeCluster(tmp_path)
    ids = ["n0", "n1", "n2"]  # a chain rooted at n1: its loss needs the new edge n0-n2
    mine: dict[str, subprocess.Popen[bytes]] = {}

    def records(node: str) -> Rows:
        return _rows(tmp_path / f"{node}.jsonl")

    try:
        for node in ids:
            argv = [sys.executable, str(WORKER), "--steps", "100000", "--wait-members", "3",
                    "--sleep", "0.02", "--out", str(tmp_path / f"{node}.jsonl")]
            log = open(tmp_path / f"{node}.log", "wb")  # noqa: SIM115 - closed with the process
            mine[node] = spawn_worker(argv, fake, node, log)
            procs.append(mine[node])
            # One attached after the other: the fake picks the lowest id as the source, so a
            # reordered attach (torch imports at different speeds) made a new node a source.
            until = time.monotonic() + 60
            while node not in fake.addrs:
                assert time.monotonic() < until and mine[node].poll() is None, f"{node} attach"
                time.sleep(0.05)
        deadline = time.monotonic() + 90
        while not all(len(records(n)) >= 20 for n in ids):
            assert time.monotonic() < deadline, {n: len(records(n)) for n in ids}
            assert all(p.poll() is None for p in mine.values()), "a worker exited"
            time.sleep(0.05)
        survivors = ["n0", "n2"]
        before = max(row["policy_version"] for n in survivors for row in records(n))
        frozen = time.monotonic()
        os.killpg(mine["n1"].pid, signal.SIGSTOP)
        fake.fail("n1")  # the detector's verdict, at once
        seen = _resumed_at(records, survivors, before, 60)
        took = {n: round(t - frozen, 3) for n, t in seen.items()}
        print(f"\nfroze the root n1; freeze to the first step under the new policy: {took}")
        assert set(seen) == set(survivors), f"survivors did not resume in 60 s: {took}"
        start = {n: records(n)[-1]["step"] for n in survivors}
        while not all(records(n)[-1]["step"] >= start[n] + 10 for n in survivors):
            assert time.monotonic() < deadline + 60, "survivors stopped training"
            time.sleep(0.05)
    finally:
        for p in mine.values():  # SIGKILL ends a stopped process too
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, signal.SIGKILL)
        fake.close()
    by_step: dict[int, set[str]] = {}
    for node in ids:
        for row in records(node):
            by_step.setdefault(row["step"], set()).add(row["digest"])
    assert not {s: d for s, d in by_step.items() if len(d) > 1}, "states diverged"
