"""The signed control plane end to end: real mosquitto (or the embedded broker), real chaosd.

Issue 11's attack: a client that reaches the broker but holds no secret publishes a retained
``sched/leader`` claim naming a live node at term 999, forged fenced commands and a forged
cluster state. None of it may move the scheduler or run a command; every node counts the
failures and logs them at a rate limit; the scheduler repairs the retained topics. Then the
replays: validly signed messages captured off the wire and published again, at once and after
the freshness window, give no power either.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
import pytest

from chaosctl.cluster import LocalCluster
from daemon.contracts.control import call_once
from daemon.contracts.messages import (
    ClusterState,
    Command,
    Heartbeat,
    LeaderClaim,
    NodeRecord,
    Request,
    decode,
    encode,
)
from daemon.contracts.signing import ControlAuth, control_key
from tests.integration.conftest import BROKERS, wait_until
from tests.integration.test_bad_input import (
    CLUSTER,
    ROOT,
    agreed,
    counter,
    publish_all,
    raw_client,
    retained,
)

pytestmark = pytest.mark.timeout(120)
MakeCluster = Callable[..., LocalCluster]
WRONG = ControlAuth(control_key("not-the-cluster-secret-at-all", CLUSTER))


def sealed(auth: ControlAuth, topic: str, body: bytes, age_s: float = 0.0) -> bytes:
    return auth.seal(topic, body, time.time() - age_s)


def steady(c: LocalCluster, nodes: list[str], want: tuple[str, int], seconds: float) -> None:
    """``want`` stays the agreed (scheduler, term) on ``nodes`` for ``seconds``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        got = wait_until(lambda: c.agreed(nodes), 5, "agreement")
        assert got == want, f"the scheduler moved: {got} (was {want})"
        time.sleep(0.2)


@pytest.mark.parametrize("broker", BROKERS)
def test_forgeries_without_the_secret_change_nothing(make_cluster: MakeCluster,
                                                      broker: str) -> None:
    c = make_cluster(3, broker)
    ids = c.node_ids
    sched, term = wait_until(lambda: agreed(c, ids), 25, "one scheduler")
    victim = next(n for n in ids if n != sched)
    before = {n: (counter(c, n, "auth_failed"), counter(c, n, "commands")) for n in ids}

    claim = encode(LeaderClaim(id=victim, term=999))
    state = encode(ClusterState(term=999, leader=victim, version=1,
                                nodes={victim: NodeRecord(state="active")}))
    shared: list[tuple[str, bytes, bool]] = [
        (f"{ROOT}/sched/leader", claim, True),              # the attack in the issue
        (f"{ROOT}/sched/leader", sealed(WRONG, f"{ROOT}/sched/leader", claim), True),
        (f"{ROOT}/cluster/state", state, True),
        (f"{ROOT}/cluster/state", sealed(WRONG, f"{ROOT}/cluster/state", state), True),
        (f"{ROOT}/sched/req", encode(Request(node=victim, req_id="x-1", op="leave")), False),
        (f"{ROOT}/node/ghost/hb", encode(Heartbeat(node="ghost", seq=1, incarnation=1, step=0,
                                                   state="active", cpu_percent=0,
                                                   mem_percent=0)), False),
    ]
    messages = list(shared)
    for node in ids:
        topic = f"{ROOT}/node/{node}/cmd"
        peer = next(n for n in ids if n != node)
        cmd = encode(Command(term=999, leader=victim, seq=1, op="disconnect",
                             args={"peer": peer}))
        good_len = sealed(WRONG, topic, cmd)
        messages += [(topic, cmd, False), (topic, good_len, False),
                     (topic, good_len[:-10] + b'"}', False)]  # a truncated signature
    publish_all(c.port, messages)

    # A follower subscribes to neither sched/req nor other followers' heartbeats (it hears
    # only the scheduler's), so the broker never hands it those two forgeries.
    def expected(node: str) -> int:
        return len(shared) + 3 - (0 if node == sched else 2)

    def all_counted() -> bool:
        return all(counter(c, n, "auth_failed") - before[n][0] >= expected(n) for n in ids)
    wait_until(all_counted, 20, "every node to count the forgeries")
    steady(c, ids, (sched, term), 2.0)
    for node in ids:
        assert counter(c, node, "commands") == before[node][1], f"{node} ran a forged command"
        assert "ghost" not in [r["id"] for r in c.query(node, "nodes")]

    # The scheduler put its own signed claim and snapshot back over the forgeries.
    auth = ControlAuth(control_key(c.secret, CLUSTER))

    def repaired() -> bool:
        topics = [f"{ROOT}/sched/leader", f"{ROOT}/cluster/state"]
        got = retained(c.port, topics)
        try:
            lead = decode(auth.open(topics[0], got[topics[0]], time.time(), retained=True,
                                    retainable=True), LeaderClaim)
            snap = decode(auth.open(topics[1], got[topics[1]], time.time(), retained=True,
                                    retainable=True), ClusterState)
        except Exception:
            return False
        assert isinstance(lead, LeaderClaim) and isinstance(snap, ClusterState)
        return (lead.id, lead.term) == (sched, term) and (snap.leader, snap.term) == (sched, term)
    wait_until(repaired, 20, "the retained claim and snapshot repaired", every=0.3)
    for node in ids:
        text = c.nodes[node].log.read_text(errors="replace")
        lines = [ln for ln in text.splitlines() if "failed authentication" in ln]
        # Rate-limited: one line at once, then at most one per 10 s, not one per message.
        assert 1 <= len(lines) <= 3, lines
        assert "Traceback" not in text


class Capture:
    """A raw subscriber that keeps every payload seen on ``chaos/<cluster>/#``."""

    def __init__(self, port: int) -> None:
        self.seen: list[tuple[str, bytes]] = []
        self._lock = threading.Lock()
        self._ctx = raw_client(port)
        client = self._ctx.__enter__()

        def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
            with self._lock:
                self.seen.append((msg.topic, bytes(msg.payload)))
        client.on_message = on_message
        client.subscribe(f"{ROOT}/#", qos=1)

    def first(self, topic: str, kind: type, pred: Callable[[Any], bool]) -> bytes | None:
        with self._lock:
            seen = list(self.seen)
        for t, payload in seen:
            if t != topic or not payload:
                continue
            try:
                msg = decode(payload.rsplit(b',"_ts":', 1)[0] + b"}", kind)
            except Exception:
                continue
            if pred(msg):
                return payload
        return None

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)


def test_replayed_signed_messages_give_no_power(make_cluster: MakeCluster) -> None:
    c = make_cluster(3, "mosquitto", config="auth_window_s = 2.0\n")
    ids = c.node_ids
    cap = Capture(c.port)
    try:
        sched, term = wait_until(lambda: agreed(c, ids), 25, "one scheduler")
        f1, f2 = [n for n in ids if n != sched]
        # Real commands: the scheduler's replies to link requests from f1 and from itself.
        call_once(c.socket_of(f1), "link", {"peer": f2, "action": "add"}, timeout=8)
        call_once(c.socket_of(sched), "link", {"peer": f1, "action": "add"}, timeout=8)
        cmd_topic, own_topic = f"{ROOT}/node/{f1}/cmd", f"{ROOT}/node/{sched}/cmd"
        cmd = wait_until(lambda: cap.first(cmd_topic, Command, lambda m: m.op == "reply"), 10,
                         "a captured command")
        own = wait_until(lambda: cap.first(own_topic, Command, lambda m: m.op == "reply"), 10,
                         "a captured command to the scheduler")
        claim = wait_until(lambda: cap.first(f"{ROOT}/sched/leader", LeaderClaim,
                                             lambda m: (m.id, m.term) == (sched, term)), 10,
                           "the captured claim")
        hb_topic = f"{ROOT}/node/{sched}/hb"
        beat = wait_until(lambda: cap.first(hb_topic, Heartbeat, lambda m: True), 10,
                          "a captured heartbeat")
        def old_replies() -> int:  # commands f1 ran from the first scheduler's term
            text = c.nodes[f1].log.read_text(errors="replace")
            return text.count(f"command reply from {sched} (term {term})")
        ran = old_replies()

        # At once: the replay cache refuses the copy; on another node's topic it is forged.
        publish_all(c.port, [(cmd_topic, cmd, False), (f"{ROOT}/node/{f2}/cmd", cmd, False)])
        wait_until(lambda: counter(c, f1, "auth_replayed") >= 1, 10, "the replay refused")
        wait_until(lambda: counter(c, f2, "auth_bad_signature") >= 1, 10, "moved cmd refused")

        # The scheduler dies; the survivors elect another at a higher term.
        c.kill(sched)
        survivors = [f1, f2]
        new = wait_until(lambda: (a := c.agreed(survivors)) and a[1] > term and a, 25,
                         "a new scheduler")
        time.sleep(2.5)  # past the freshness window
        stale_before = {n: counter(c, n, "auth_stale") for n in survivors}
        # The old claim, command and the dead scheduler's heartbeat, replayed live and retained.
        publish_all(c.port, [(f"{ROOT}/sched/leader", claim, True), (cmd_topic, cmd, False),
                             (hb_topic, beat, False)])
        # Each survivor hears the claim; f1 its command; only the new scheduler hears the
        # dead one's heartbeat topic (a follower hears the scheduler's alone).
        def stale_expected(node: str) -> int:
            return 1 + (node == f1) + (node == new[0])
        wait_until(lambda: all(counter(c, n, "auth_stale") >= stale_before[n] + stale_expected(n)
                               for n in survivors), 10, "the stale replays refused")
        steady(c, survivors, new, 2.0)
        assert old_replies() == ran, "a replayed command was acted on"
        rows = {r["id"]: r for r in c.query(f1, "nodes")}
        assert rows[sched]["state"] in ("failed", "left"), rows[sched]

        # A command left retained on the dead node's topic waits for it on the broker. The
        # node comes back and reads it as a new subscriber: refused, since commands are never
        # retained. It follows the new scheduler, whatever the old claim said.
        publish_all(c.port, [(own_topic, own, True)])
        c.start_node(sched)
        wait_until(lambda: c.agreed(ids) == new, 25, "the restarted node follows the new one")
        wait_until(lambda: counter(c, sched, "auth_retained") >= 1, 10, "retained cmd refused")
        assert counter(c, sched, "commands") == 0
    finally:
        cap.close()
