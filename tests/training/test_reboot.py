"""A box that reboots rejoins by itself (issue 21): chaosd remembers the job it supervises.

Real mosquitto, real chaosd processes, real workers. A box's daemon is killed with SIGKILL (a
power cut takes the worker with it: it dies with its parent) and started again on the same
data dir, as systemd does after a reboot. Nobody runs ``chaosctl join``: the daemon starts the
remembered job, and its worker rejoins by scale-out from the members that trained on. After
the operator's ``leave`` the job is forgotten.
"""

from __future__ import annotations

import signal
from typing import Any

import pytest

from chaosctl.client import call_once
from daemon.agent.memory import JOB_FILE
from daemon.agent.worker import pid_alive

pytestmark = pytest.mark.timeout(180)


def test_a_box_back_from_a_power_cut_starts_its_job_and_rejoins(run: Any) -> None:
    r = run(3)
    ids = r.c.node_ids
    victim = ids[-1]  # not the first scheduler: this is about the job, not a failover
    r.join_all(ids)
    r.advance(ids, 5)
    job = r.c.workdir / victim / JOB_FILE
    assert job.exists() and job.stat().st_mode & 0o077 == 0  # the environment is private
    old = r.worker_pid(victim)
    r.signal_node(victim, signal.SIGKILL)
    r.c.wait(lambda: not pid_alive(old), 30, "the worker to die with its daemon")
    survivors = [n for n in ids if n != victim]
    r.c.wait(lambda: any(e["node"] == victim for e in r.events("scale-in")), 30,
             f"{victim} scaled in")
    r.advance(survivors, 5)
    r.c.start_node(victim)  # what systemd does when the box is back; no `chaosctl join`
    r.c.wait(lambda: r.worker_pid(victim) not in (0, old), 60, "the remembered job to start")
    r.c.wait(lambda: r.active(ids), 90, f"{victim} to rejoin")
    outs = [e for e in r.events("scale-out") if e["node"] == victim]
    assert len(outs) >= 2 and not outs[-1].get("bootstrap") and outs[-1]["sources"]
    marks = {n: len(r.records(n)) for n in ids}
    r.advance(ids, 5)
    assert all(len(r.records(n)) > marks[n] for n in ids)
    r.assert_consistent()
    # The operator's leave is final: the job is forgotten, so a restart starts nothing.
    assert call_once(r.c.socket_of(victim), "leave", timeout=5)["state"] == "leaving"
    r.c.wait(lambda: r.worker_pid(victim) == 0, 60, "the worker to leave")
    assert not job.exists()
