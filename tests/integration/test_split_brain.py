"""A scheduler that dies while the broker is down must not come back as a second scheduler.

The soak's fault 1 (BENCHMARKS.md, Soak): mosquitto without persistence restarts, so every
retained message is gone (the leader claim, ``cluster/state``), and the scheduler's last will was
never delivered, because the broker that held its session is the one that went away. The
scheduler's chaosd reboots into that void. It must not elect itself at term 1 and bootstrap a
fresh cluster beside the one its peers still run: it follows them, or leads them at a higher
term from their state.

Real chaosd processes, a real mosquitto restarted on the same port, real training workers.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from chaosctl.cluster import LocalCluster
from tests.integration.conftest import wait_until
from tests.training._run import Run

MakeCluster = Callable[..., LocalCluster]


def _leading(c: LocalCluster, nodes: list[str]) -> dict[str, int]:
    """node -> term, for every node that says it is the scheduler now."""
    out = {}
    for node in nodes:
        info = c.query(node, "ping") or {}
        if info.get("leader"):
            out[node] = int(info["term"])
    return out


def _kill_scheduler_during_outage(c: LocalCluster, sched: str,
                                  before_kill: Callable[[], None] | None = None) -> None:
    c.stop_broker()
    wait_until(lambda: all(not (c.query(n, "ping") or {"connected": True})["connected"]
                           for n in c.node_ids), 15, "every node to notice the broker is gone")
    if before_kill is not None:
        before_kill()
    c.kill(sched, signal.SIGKILL)
    c.start_broker()
    c.start_node(sched)  # the soak reboots 2-10 s later; at once is the hardest case


def _watch(c: LocalCluster, term: int, seconds: float) -> list[tuple[str, int]]:
    """Poll who leads for ``seconds``; every (node, term) that led at a term <= ``term``."""
    stale: list[tuple[str, int]] = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        for node, t in _leading(c, c.node_ids).items():
            if t <= term:
                stale.append((node, t))
        time.sleep(0.1)
    return stale


@pytest.mark.timeout(120)
def test_rebooted_scheduler_never_leads_a_second_cluster(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, "mosquitto")
    ids = c.node_ids
    sched, term = wait_until(lambda: c.agreed(ids, {"standby": 3}), 20, "one scheduler")
    _kill_scheduler_during_outage(c, sched)
    # Nobody, the rebooted node included, may lead at the dead scheduler's term or below
    # (a fresh process at term 1 was the fault).
    stale = _watch(c, term, 12.0)
    assert stale == [], f"led at a stale term after the reboot: {sorted(set(stale))}"
    _, new_term = wait_until(lambda: c.agreed(ids, {"standby": 3}), 30,
                               "one scheduler over all three nodes")
    assert new_term > term
    assert len(_leading(c, ids)) == 1
    # What the rebooted node knew: the term, kept in its data dir.
    def remembered() -> dict[str, object] | None:  # written within a tick of the claim
        doc = json.loads((c.workdir / sched / "election.json").read_text())
        return doc if doc["cluster"] == c.cluster and doc["term"] >= new_term else None
    wait_until(remembered, 5, f"{sched} to remember term {new_term}")


@pytest.mark.timeout(180)
def test_training_survives_scheduler_death_during_broker_outage(
        make_cluster: MakeCluster, tmp_path: Path) -> None:
    c = make_cluster(3, "mosquitto")
    r = Run(c, tmp_path)
    ids = c.node_ids
    sched, term = wait_until(lambda: c.agreed(ids, {"standby": 3}), 20, "one scheduler")
    r.join_all(ids)  # the first bootstraps the model, the others join it
    r.advance(ids, 5, timeout=60)
    survivors = [n for n in ids if n != sched]
    # The worker dies with its box (as in the soak): chaosd and worker are killed together.
    _kill_scheduler_during_outage(c, sched, lambda: r.signal_node(sched, signal.SIGKILL))
    wait_until(lambda: c.agreed(ids), 40, "one scheduler after the reboot")
    # No `chaosctl join`: the rebooted chaosd starts the job it remembers.
    wait_until(lambda: r.active(ids), 90, "the rebooted node to rejoin the survivors")
    r.advance(ids, 5, timeout=90)
    # One cluster: every step that two nodes committed has one digest (a bootstrapped second
    # cluster restarts at step 1 from a fresh model and breaks this at once).
    r.assert_consistent()
    rows = r.records(sched)
    assert rows[-1]["step"] > max(r.step(n) for n in survivors) - 50
    _, new_term = c.agreed(ids) or ("", 0)
    assert new_term > term
