"""A source whose replicate command comes after the round with the new node began.

The command and the policy travel apart. A source waits a few seconds before its first round
with a new neighbour (Source.before_round), then runs it; that round waits on the new node,
and the new node waits on the source's offer, which is made only between rounds. When the
command came later still (a broker restart lost the first copy and the scheduler sent it
again), the round sat until its phase timed out (a quarter of the step timeout: 30 s by
default) before the source served. Now the command ends the round at once, the source serves
at the rerun's boundary, and training goes on with the new node in step.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from chaos_edge.trainer.source import SERVE_WAIT_S
from tests.training._fake import FakeCluster, worker_env

pytestmark = pytest.mark.timeout(180)
STEPS = 300
WORKER = str(Path(__file__).with_name("_worker.py"))


def _lines(path: Path) -> list[dict[str, object]]:
    if not path.exists():
        return []
    return [json.loads(x) for x in path.read_text().splitlines() if x.strip()]


def test_a_late_command_to_serve_ends_the_round_that_waits_for_the_new_node(
        tmp_path: Path) -> None:
    fake = FakeCluster(tmp_path)
    fake.source_late_s = SERVE_WAIT_S + 3.0  # after the source gave up waiting for it
    procs: dict[str, subprocess.Popen[bytes]] = {}

    def start(node: str, *extra: str) -> None:
        argv = [sys.executable, WORKER, "--steps", str(STEPS), "--sleep", "0.05", "--out",
                str(tmp_path / f"{node}.jsonl"), *extra]
        log = open(tmp_path / f"{node}.log", "wb")  # noqa: SIM115 - closed with the process
        procs[node] = subprocess.Popen(argv, env=worker_env(fake.socket_for(node), node),
                                       stdout=log, stderr=subprocess.STDOUT,
                                       start_new_session=True)  # fmt: skip

    try:
        start("n0")
        deadline = time.monotonic() + 60
        while len(_lines(tmp_path / "n0.jsonl")) < 5:
            assert time.monotonic() < deadline, "n0 did not train"
            assert procs["n0"].poll() is None, "n0 exited early"
            time.sleep(0.1)
        start("n1")
        deadline = time.monotonic() + 150
        while any(p.poll() is None for p in procs.values()):
            assert time.monotonic() < deadline, "workers did not finish"
            time.sleep(0.2)
        logs = {n: (tmp_path / f"{n}.log").read_text(errors="replace") for n in procs}
        assert {n: p.returncode for n, p in procs.items()} == dict.fromkeys(procs, 0), logs
        # The source ran its first round with n1 before the command came, and that round
        # ended on the command, not on its timeout.
        aborts = [str(r.get("reason")) for n, r in fake.reports
                  if n == "n0" and r.get("kind") == "round-aborted"]
        assert any(a.startswith("serving n1") for a in aborts), (aborts, logs["n0"][-3000:])
        assert not any("timed out" in a for a in aborts), aborts
        by_step: dict[int, set[str]] = {}
        for node in procs:
            for rec in _lines(tmp_path / f"{node}.jsonl"):
                by_step.setdefault(int(str(rec["step"])), set()).add(str(rec["digest"]))
        assert by_step[STEPS] and all(len(d) == 1 for d in by_step.values())
        assert max(int(str(r["step"])) for r in _lines(tmp_path / "n1.jsonl")) == STEPS
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.wait(10)
        fake.close()
