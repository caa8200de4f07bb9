"""A member that crashes while the broker is down, and comes straight back, must rejoin.

The soak's fault 2 (BENCHMARKS.md, Soak): joins wedged after broker restarts. A member killed
while the broker is away has no last will delivered (the broker that held its session is gone),
so nobody declared it failed; its chaosd rebooted as a new process, and the scheduler re-admitted
it as a standby while the sync policy still named it a member. Every round then waited for a
worker that no longer existed, the sources never served the rejoining node ("no snapshot of
step N"), and its join timed out over and over. Now a member that comes back as a new
incarnation is scaled in first (``node-failed``, reason ``restarted``; tests/cluster pins that
rule) and then joins afresh: its chaosd starts the job it remembers (no ``chaosctl join``).

Real chaosd processes, a real mosquitto restarted on the same port, real training workers.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chaosctl.cluster import LocalCluster
from tests.integration.conftest import wait_until
from tests.training._run import Run

MakeCluster = Callable[..., LocalCluster]


@pytest.mark.timeout(180)
def test_member_killed_during_broker_outage_rejoins(make_cluster: MakeCluster,
                                                    tmp_path: Path) -> None:
    c = make_cluster(3, "mosquitto")
    r = Run(c, tmp_path)
    ids = c.node_ids
    sched, term = wait_until(lambda: c.agreed(ids, {"standby": 3}), 20, "one scheduler")
    r.join_all(ids)  # the first bootstraps the model, the others join it
    r.advance(ids, 5, timeout=60)
    victim = next(n for n in ids if n != sched)

    outage = time.time()
    c.stop_broker()
    wait_until(lambda: all(not (c.query(n, "ping") or {"connected": True})["connected"]
                           for n in ids), 15, "every node to notice the broker is gone")
    r.signal_node(victim, signal.SIGKILL)  # chaosd and its worker, as a power cut
    c.start_broker()
    c.start_node(victim)
    wait_until(lambda: (c.query(victim, "ping") or {}).get("connected"), 20,
               f"{victim} back on the broker")
    # No `chaosctl join`: the rebooted chaosd starts the job it remembers.

    wait_until(lambda: r.active(ids), 90, f"{victim} to rejoin")
    r.advance(ids, 5, timeout=90)
    r.assert_consistent()
    assert c.agreed(ids) == (sched, term)  # the scheduler lived through it: no election
    # It came back by a fresh scale-out of its new process (the old one was scaled in first:
    # as ``restarted``, or cut off by the link failures its death caused, whichever came first).
    wait_until(lambda: [e for e in c.events(sched, "scale-out", since_ts=outage)
                        if e.get("node") == victim], 10, f"the scale-out event of {victim}")
