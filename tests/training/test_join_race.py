"""A new node's first frames reach a member that has not yet committed the round before it.

Three Trainer processes train on a chain n0-n1-n2 (root n1); n3 joins with n0 as its source,
and the new chain puts it under n2. The root is slow to send n2 its COMMIT while the join waits
to take effect (a slow link just then). n0 commits, serves, and n3 restores and opens the
next round's agreement with its parent n2, so n2 hears the newer epoch before its COMMIT
lands. Ending n2's round on that frame left it a round behind, in an epoch every peer had
left, until its step timed out (the demo's stall after a scale-out). The round must commit and
all four must train on in step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.training._fake import FakeCluster, worker_env

pytestmark = pytest.mark.timeout(150)
STEPS = 400  # at 0.05 s a step, n3 (a fresh torch process) starts well within them
WORKER = str(Path(__file__).with_name("_worker.py"))


def _lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_new_nodes_agreement_does_not_end_its_parents_last_round(tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path)
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(node: str, *extra: str) -> None:
        # Paced steps: the first three must still be training when n3 joins.
        argv = [sys.executable, WORKER, "--steps", str(STEPS), "--sleep", "0.05", "--out",
                str(tmp_path / f"{node}.jsonl"), *extra]
        log = open(tmp_path / f"{node}.log", "wb")  # noqa: SIM115 - closed with the process
        procs[node] = subprocess.Popen(argv, env=worker_env(fake.socket_for(node), node),
                                       stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # fmt: skip

    try:
        start("n0", "--wait-members", "3")
        time.sleep(0.3)
        # The root sends n0 its COMMIT, then waits before n2's, while the join is pending.
        start("n1", "--wait-members", "3", "--stall", "commit:0:2.0")
        time.sleep(0.3)
        start("n2", "--wait-members", "3")
        deadline = time.monotonic() + 60
        while len(_lines(tmp_path / "n0.jsonl")) < 5:
            assert time.monotonic() < deadline, "the first three did not train"
            assert all(p.poll() is None for p in procs.values()), "a worker exited early"
            time.sleep(0.1)
        start("n3")
        deadline = time.monotonic() + 120
        while any(p.poll() is None for p in procs.values()):
            assert time.monotonic() < deadline, "workers did not finish"
            time.sleep(0.2)
        logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in procs}
        assert {n: p.returncode for n, p in procs.items()} == dict.fromkeys(procs, 0), logs
        # n2 never ended a round on n3's frames: no rerun, no mismatch.
        mismatches = [(n, r) for n, r in fake.reports if r.get("kind") == "round-aborted"
                      and "mismatch" in str(r.get("reason"))]  # fmt: skip
        assert mismatches == []
        # Every member holds the same state at every step it committed.
        by_step: dict[int, set[str]] = {}
        for node in procs:
            for rec in _lines(tmp_path / f"{node}.jsonl"):
                by_step.setdefault(int(str(rec["step"])), set()).add(str(rec["digest"]))
        assert by_step[STEPS] and all(len(d) == 1 for d in by_step.values())
        assert max(int(str(r["step"])) for r in _lines(tmp_path / "n3.jsonl")) == STEPS
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
        fake.close()
