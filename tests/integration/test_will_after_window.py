"""A last will is signed when its connection opens and fires whenever the node dies: hours
later, far outside the freshness window of live control messages. The first hour-long soak
found every peer dropping such wills as ``stale`` (and counting them as authentication
failures), so a crash was noticed only by heartbeats. A last will now passes outside the window
(fenced by incarnation and connection time); every other message still must be fresh.

Real chaosd processes on a real mosquitto, with a 2 s window so that "long after" is seconds.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable

import paho.mqtt.client as mqtt
import pytest

from chaosctl.cluster import LocalCluster
from daemon.contracts.messages import Status, encode
from daemon.contracts.signing import ControlAuth, control_key
from tests.integration.conftest import wait_until

MakeCluster = Callable[..., LocalCluster]
WINDOW_S = 2.0


def _counter(c: LocalCluster, node: str, key: str) -> int:
    return int(((c.query(node, "ping") or {}).get("counters") or {}).get(key, 0))


@pytest.mark.timeout(90)
def test_a_will_older_than_the_window_still_counts(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, "mosquitto", config=f"auth_window_s = {WINDOW_S}\n")
    ids = c.node_ids
    sched, term = wait_until(lambda: c.agreed(ids, {"standby": 3}), 25, "one scheduler")
    victim = next(n for n in ids if n != sched)
    time.sleep(3 * WINDOW_S)  # the victim's will is now older than the window
    stale = {n: _counter(c, n, "auth_stale") for n in ids}

    c.kill(victim, signal.SIGKILL)
    failed = wait_until(lambda: [e for e in c.events(sched, "node-failed")
                                 if e.get("node") == victim], 20, f"{victim} declared failed")
    assert failed[-1]["reason"] == "last-will", failed
    for node in (n for n in ids if n != victim):
        assert _counter(c, node, "auth_stale") == stale[node], f"{node} dropped the will"
    assert c.agreed([n for n in ids if n != victim]) == (sched, term)


@pytest.mark.timeout(90)
def test_a_replayed_old_up_is_fenced(make_cluster: MakeCluster) -> None:
    """An "up" of an earlier connection than the one a peer holds changes nothing, even
    inside the window (a node that reconnected twice in a second, replayed)."""
    c = make_cluster(3, "mosquitto", config=f"auth_window_s = {WINDOW_S}\n")
    ids = c.node_ids
    sched, term = wait_until(lambda: c.agreed(ids, {"standby": 3}), 25, "one scheduler")
    victim = next(n for n in ids if n != sched)
    incarnation = int((c.query(victim, "ping") or {})["incarnation"])
    auth = ControlAuth(control_key(c.secret, c.cluster))
    topic = f"chaos/{c.cluster}/node/{victim}/status"
    old_up = Status(node=victim, online=True, reason="up", incarnation=incarnation,
                    addr="10.9.9.9", ts=1.0)  # an ancient connection of the same process
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"replay-{time.time()}")
    client.connect("127.0.0.1", c.port)
    client.loop_start()
    try:
        client.publish(topic, auth.seal(topic, encode(old_up), time.time()),
                       qos=1).wait_for_publish(5)
        # Outside the window, only a last will passes; an old "up" is stale at once.
        client.publish(topic, auth.seal(topic, encode(old_up), time.time() - 3600),
                       qos=1).wait_for_publish(5)
        wait_until(lambda: _counter(c, sched, "auth_stale") >= 1, 10, "the old up refused")
        wait_until(lambda: _counter(c, sched, "stale_statuses") >= 1, 10, "the replay fenced")
    finally:
        client.disconnect()
        client.loop_stop()
    rows = {r["id"]: r for r in c.query(sched, "nodes") or []}
    assert rows[victim]["addr"] == "127.0.0.1"
    assert c.agreed(ids, {"standby": 3}) == (sched, term)
