"""A node whose worker has gone (a graceful leave, or its worker exited) must not be rejoined by
a link report: the hour-long soak saw a leaver's link recover 3 s after its leave, the scheduler
"rejoined" it with its old worker's address, every member's rounds then waited for a worker that
had exited, all of them timed out, and the cluster lost its state. The node rejoins when its
next worker asks to."""

from __future__ import annotations

import pytest

from daemon.contracts.clock import FakeClock
from daemon.contracts.messages import Heartbeat
from tests.cluster.test_role import FakeHost, join, request

pytestmark = pytest.mark.timeout(10)


def _beat(host: FakeHost, role: object, node: str, incarnation: int = 1) -> None:
    host.detector.heartbeat(node)
    hb = Heartbeat(node=node, seq=2, incarnation=incarnation, step=0, state="standby",
                   cpu_percent=0.0, mem_percent=0.0)
    role.on_heartbeat(hb, f"10.0.0.{node}")  # type: ignore[attr-defined]


@pytest.mark.parametrize("how", ["leave", "worker-exit"])
def test_link_recovered_does_not_rejoin_a_node_without_a_worker(how: str) -> None:
    host = FakeHost(FakeClock())
    role = host.elect()
    join(host, role, "1", "2", "3")
    if how == "leave":
        request(role, "3", "leave", step=0)
    else:
        request(role, "3", "worker-exit", code=0, reason="worker-exit")
    _beat(host, role, "3")  # its chaosd lives on: the heartbeat re-admits it as a standby
    assert role.sched.nodes["3"].state == "standby"
    replicates = len(host.commands("replicate"))
    request(role, "2", "report", kind="link-failed", peer="3")
    request(role, "2", "report", kind="link-recovered", peer="3")
    assert role.sched.nodes["3"].state == "standby"
    assert len(host.commands("replicate")) == replicates
    assert role.sched.policy is not None and "3" not in role.sched.policy.members
    # Its next worker asks to join, with its address: now it rejoins.
    request(role, "3", "join", addr="10.0.0.3:7001", neighbors=[])
    assert role.sched.nodes["3"].state == "joining"
