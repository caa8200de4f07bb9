"""A hung worker on a healthy node: chaosd kills it, the others train on, it rejoins.

Three real chaosd on a real mosquitto, each running a real worker (``chaosctl join -- CMD``).
One worker alone is frozen with SIGSTOP while its daemon stays up: it stops polling, so after
``[worker] poll_silence_s`` (4 s by default) its daemon reports it gone (the scheduler drops it
from the rounds at once), SIGKILLs it, which closes its links, and restarts it; the new
process rejoins through scale-out. Issue 8: the survivors must train again within 10 s of the
freeze (before the watchdog they made no step for 60 s).
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from typing import Any

import pytest

from daemon.agent.worker import pid_alive

pytestmark = pytest.mark.timeout(240)


def test_a_frozen_worker_is_killed_dropped_and_rejoins(run: Any) -> None:
    r = run(3)
    nodes = r.c.node_ids
    r.join_all(nodes)
    r.advance(nodes, 20)
    victim, survivors = nodes[-1], nodes[:-1]
    pid = r.worker_pid(victim)
    assert pid
    os.killpg(pid, signal.SIGSTOP)  # the worker only: its daemon stays up and healthy
    frozen = time.monotonic()
    try:
        # At most the round in flight can finish with the frozen worker's share; two more
        # steps each are rounds without it.
        base = {n: r.step(n) for n in survivors}
        r.c.wait(lambda: all(r.step(n) >= base[n] + 2 for n in survivors), 60,
                 "the survivors to train again")
        resumed = time.monotonic() - frozen
        r.c.wait(lambda: r.worker_pid(victim) not in (0, pid), 60, "a restarted worker")
        assert not pid_alive(pid), "the frozen worker was not killed"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGCONT)  # only if it outlived the test's checks
    r.c.wait(lambda: len([e for e in r.events("scale-out") if e["node"] == victim]) >= 2
             and r.active(nodes), 90, f"{victim} to rejoin by scale-out")
    rejoined = time.monotonic() - frozen
    print(f"\nfreeze -> survivors' step {resumed:.2f} s; freeze -> rejoined {rejoined:.2f} s")
    drops = [e for e in r.events("scale-in") if e["node"] == victim]
    assert [e["reason"] for e in drops] == ["worker-unresponsive"]
    assert not r.events("node-failed"), "the daemon stayed up: no node failed"
    assert r.c.query(victim, "ping")["worker"]["restarts"] == 1
    r.advance(nodes, 20)
    r.assert_consistent()
    r.assert_loss_falls(survivors[0])
