"""A stuck round keeps the state (issue 21): the step timeout is an alarm, not an exit.

Real mosquitto, real chaosd processes, real workers. The broker goes away for several step
timeouts: every chaosd is out of touch, so no worker may start a round, and every member is
stuck on the same step. Before, each worker raised ``TrainerError`` at its timeout and exited,
all at once, and the cluster's state went with them. Now each says so (a warning, and a
``round-stuck`` report the scheduler records once the broker is back), keeps its state, and
training goes on from where it stood when the broker returns.
"""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest

pytestmark = pytest.mark.timeout(180)

TIMEOUT_S = 2.0  # the workers' step timeout: short, so the stall outlasts it several times
ALARM = "keeping the state and waiting"


def training(run: Any, config: str = "") -> tuple[Any, list[str], dict[str, int]]:
    """Two members training with the short step timeout; their worker pids."""
    r = run(2, config=config)
    ids = r.c.node_ids
    r.join_all(ids, extra=["--timeout", str(TIMEOUT_S)])
    r.advance(ids, 5)
    return r, ids, {n: r.worker_pid(n) for n in ids}


def test_a_cluster_wide_stall_longer_than_the_step_timeout_keeps_every_worker(run: Any) -> None:
    r, ids, pids = training(run)
    logs = {n: r.c.workdir / n / "worker.log" for n in ids}
    r.c.stop_broker(signal.SIGKILL)  # the gateway's power cut: every round stops

    def alarms(node: str) -> int:
        return logs[node].read_text(errors="replace").count(ALARM)

    # Each worker's alarm rings at least twice: it waited past two step timeouts, alive.
    r.c.wait(lambda: all(alarms(n) >= 2 for n in ids), 60, "each worker's step alarm twice")
    stuck_at = {n: r.step(n) for n in ids}
    r.c.start_broker()
    r.advance(ids, 5, timeout=90)
    assert {n: r.worker_pid(n) for n in ids} == pids, "a worker exited on a stuck round"
    # Training went on from the state it held: no step went back, nothing started over.
    for n in ids:
        steps = [row["step"] for row in r.records(n)]
        assert steps == sorted(steps) and steps[-1] > stuck_at[n], (n, steps[-10:])
        assert "TrainerError" not in logs[n].read_text(errors="replace")
    r.assert_consistent()
    r.c.wait(lambda: r.events("round-stuck"), 30, "the round-stuck events")
    ev = r.events("round-stuck")[0]
    assert ev["node"] in ids and ev["waited_s"] >= TIMEOUT_S


def test_a_member_frozen_longer_than_the_step_timeout_holds_up_the_round_not_the_state(
        run: Any) -> None:
    """A member's worker frozen (SIGSTOP) with chaosd's liveness check off: the other waits
    on it in the all-reduce, past several step timeouts, then both go on when it thaws."""
    r, ids, pids = training(run, config="[worker]\npoll_silence_s = 0\n")
    frozen, waiting = ids
    log = r.c.workdir / waiting / "worker.log"
    os.kill(pids[frozen], signal.SIGSTOP)
    try:
        r.c.wait(lambda: log.read_text(errors="replace").count(ALARM) >= 2, 60,
                 f"{waiting}'s step alarm twice")
    finally:
        os.kill(pids[frozen], signal.SIGCONT)
    r.advance(ids, 5, timeout=90)
    assert {n: r.worker_pid(n) for n in ids} == pids, "a worker exited on a stuck round"
    assert "TrainerError" not in log.read_text(errors="replace")
    r.assert_consistent()
    r.c.wait(lambda: any(e["node"] == waiting for e in r.events("round-stuck")), 30,
             f"{waiting}'s round-stuck event")
