"""Garbage on every MQTT topic and on the control socket: rejected, logged, nothing corrupted.

A real 3-node cluster agrees on a scheduler; then a raw paho client that holds the cluster
secret (so that its payloads get past authentication to the decoders) publishes malformed,
oversized, wrong-version and stale messages to every topic the daemons subscribe. Afterwards
every daemon must be alive, still agree on the same scheduler and term, count the rejections,
keep its node table, and the scheduler must have repaired the retained topics that a stale
claim and a stale snapshot overwrote. Stale-term commands are fenced. The control socket gets
the same treatment with raw lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from chaosctl.cluster import LocalCluster
from daemon.contracts.messages import ClusterState, Command, LeaderClaim, NodeRecord, decode, encode
from daemon.contracts.signing import ControlAuth, control_key
from tests.integration.conftest import BROKERS, wait_until

pytestmark = pytest.mark.timeout(90)
MakeCluster = Callable[..., LocalCluster]
CLUSTER = "t"  # the cluster name conftest's make_cluster gives every node
ROOT = f"chaos/{CLUSTER}"


# --- helpers ------------------------------------------------------------------------------
@contextlib.contextmanager
def raw_client(port: int) -> Iterator[mqtt.Client]:
    """A connected paho client on 127.0.0.1:port with its network loop running."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, client_id=f"raw-{time.time_ns()}")
    connected = threading.Event()
    client.on_connect = lambda *_a: connected.set()
    client.connect("127.0.0.1", port, keepalive=30)
    client.loop_start()
    try:
        assert connected.wait(10), "the raw MQTT client could not connect"
        yield client
    finally:
        client.disconnect()
        client.loop_stop()


def publish_all(port: int, messages: list[tuple[str, bytes, bool]]) -> None:
    """Publish (topic, payload, retain) in order with QoS 1 and wait for every PUBACK."""
    with raw_client(port) as client:
        for topic, payload, retain in messages:
            info = client.publish(topic, payload, qos=1, retain=retain)
            info.wait_for_publish(timeout=10)
            assert info.is_published(), f"publish to {topic} was not acknowledged"


def retained(port: int, topics: list[str], wait_s: float = 1.5) -> dict[str, bytes]:
    """The retained payload of each topic as a fresh subscriber sees it."""
    got: dict[str, bytes] = {}
    done = threading.Event()

    def on_message(_c: Any, _u: Any, msg: mqtt.MQTTMessage) -> None:
        if msg.retain:
            got[msg.topic] = bytes(msg.payload)
            if set(got) >= set(topics):
                done.set()

    with raw_client(port) as client:
        client.on_message = on_message
        for topic in topics:
            client.subscribe(topic, qos=1)
        done.wait(wait_s)
    return got


def signer(c: LocalCluster) -> Callable[[str, bytes], bytes]:
    """Sign any payload for a topic with ``c``'s control key, as a node holding the secret
    would (a payload that is not a JSON object gets the envelope all the same)."""
    key = control_key(c.secret, CLUSTER)
    auth = ControlAuth(key)

    def sign(topic: str, payload: bytes) -> bytes:
        if not payload:
            return payload
        if payload.startswith(b"{") and payload.endswith(b"}") and len(payload) > 2:
            return auth.seal(topic, payload, time.time())
        signed = payload + b',"_ts":' + str(time.time_ns() // 1000).encode()
        mac = hmac.new(key, topic.encode() + b"\x00" + signed, hashlib.sha256).hexdigest()
        return signed + b',"_sig":"' + mac.encode() + b'"}'
    return sign


def agreed(c: LocalCluster, nodes: list[str]) -> tuple[str, int] | None:
    """The (scheduler, term) every node reports, if they agree and exactly that one leads."""
    return c.agreed(nodes, {"standby": len(nodes)})


def counter(c: LocalCluster, node: str, name: str) -> int:
    info = c.query(node, "ping")
    assert info is not None, f"{node} does not answer ping"
    return int(info["counters"].get(name, 0))


def heartbeat(who: str, **override: Any) -> bytes:
    body: dict[str, Any] = {"v": 1, "kind": "hb", "node": who, "seq": 1, "incarnation": 1,
                            "step": 0, "state": "standby", "cpu_percent": 1.0,
                            "mem_percent": 1.0}
    body.update(override)
    return json.dumps(body).encode()


def garbage_payloads(node: str) -> list[bytes]:
    """Payloads that every decoder must reject, whatever the topic."""
    big = b'{"v":1,"kind":"hb","node":"' + node.encode() + b'","pad":"' + b"x" * (300 * 1024) \
        + b'"}'
    return [
        b"\x00\xff\xfe not json at all",
        b"\xff\xfe\xfd",                                   # not UTF-8
        b"",                                               # empty
        b"[1, 2, 3]",                                      # a JSON array
        b'"just a string"',
        b"null",
        b"[" * 5000,                                       # nesting past the recursion limit
        heartbeat(node, v=2),                              # a future protocol version
        heartbeat(node, v="1"),
        json.dumps({"kind": "hb", "node": node}).encode(),  # no version at all
        heartbeat(node, kind="telepathy"),                 # unknown kind
        heartbeat(node, kind=None),
        heartbeat(node, seq="one"),                        # wrong field types
        heartbeat(node, seq=True),
        heartbeat(node, cpu_percent="hot"),
        heartbeat(node).replace(b'"cpu_percent": 1.0', b'"cpu_percent": 1e400'),  # inf
        heartbeat(node, step=1.5),
        heartbeat(node, state="zombie"),                   # unknown node state
        heartbeat(node, node="bad id/with+wildcards#"),    # a bad node id
        heartbeat(node, node="x" * 65),
        heartbeat(node, node=7),
        b'{"v":1,"kind":"hb","seq":' + b"9" * 5000 + b"}",  # past int's digit limit
        b'{"v":1,"kind":"hb","node":"' + node.encode() + b'","cpu_percent":NaN}',
        big,                                               # oversized (> 256 KiB)
    ]


# --- MQTT ---------------------------------------------------------------------------------
@pytest.mark.parametrize("broker", BROKERS)
def test_garbage_on_every_topic(make_cluster: MakeCluster, broker: str) -> None:
    c = make_cluster(3, broker)
    ids = c.node_ids
    sched, term = wait_until(lambda: agreed(c, ids), 25, "one scheduler")
    followers = [n for n in ids if n != sched]
    rejected_before = {n: counter(c, n, "rejected") + counter(c, n, "auth_failed") for n in ids}
    sign = signer(c)

    shared_topics = [f"{ROOT}/node/{n}/{kind}" for n in ids for kind in ("hb", "status")]
    shared_topics += [f"{ROOT}/sched/leader", f"{ROOT}/sched/req", f"{ROOT}/cluster/state"]
    messages: list[tuple[str, bytes, bool]] = []
    for topic in shared_topics:
        messages += [(topic, p, False) for p in garbage_payloads(ids[0])]
    cmd_topics = [f"{ROOT}/node/{n}/cmd" for n in ids]
    for topic in cmd_topics:
        messages += [(topic, p, False) for p in garbage_payloads(ids[0])]
    # Well-formed messages of the wrong kind for the topic.
    claim = encode(LeaderClaim(id=sched, term=term))
    messages += [(f"{ROOT}/node/{ids[0]}/hb", claim, False),
                 (f"{ROOT}/cluster/state", claim, False),
                 (f"{ROOT}/node/{followers[0]}/cmd", claim, False)]
    # A heartbeat whose node is not the topic's node (it would make node-2 look alive).
    messages += [(f"{ROOT}/node/{ids[0]}/hb", heartbeat(ids[1], seq=10**6), False)]
    # A topic whose id segment is not a node id at all: ignored, never routed.
    messages += [(f"{ROOT}/node/bad$id/hb", heartbeat("bad"), False)]
    # Signed, every payload reaches the decoders (the oversized one fails authentication).
    messages = [(topic, sign(topic, p), retain) for topic, p, retain in messages]
    t0 = time.monotonic()
    publish_all(c.port, messages)

    # Every shared-topic payload a node subscribes to must be rejected (the empty payload on
    # the two retained scheduler topics only clears them: not counted). The scheduler hears
    # them all; a follower hears neither sched/req nor another follower's heartbeats.
    def heard(node: str, topic: str) -> bool:
        return node == sched or not ((topic.endswith("/hb") and f"/{sched}/" not in topic)
                                     or topic == f"{ROOT}/sched/req")

    def per_node_min(node: str) -> int:
        return sum(heard(node, t) for t in shared_topics) * len(garbage_payloads(ids[0])) - 2

    def all_rejected() -> bool:
        return all(counter(c, n, "rejected") + counter(c, n, "auth_failed")
                   - rejected_before[n] >= per_node_min(n) for n in ids)
    wait_until(all_rejected, 30, "every node to reject every payload it hears: at least "
               + ", ".join(f"{n} {per_node_min(n)}" for n in ids))
    print(f"garbage published and rejected in {time.monotonic() - t0:.1f}s")

    # Stale retained state: a claim and a snapshot from a lower term, with a tempting id.
    stale_nodes = {"node-0": NodeRecord(state="active"), ids[0]: NodeRecord(state="failed")}
    stale_state = ClusterState(term=term - 1, leader="node-0", version=10**6, nodes=stale_nodes)
    stale_claim = LeaderClaim(id="node-0", term=term - 1)
    publish_all(c.port, [
        (f"{ROOT}/cluster/state", sign(f"{ROOT}/cluster/state", encode(stale_state)), True),
        (f"{ROOT}/sched/leader", sign(f"{ROOT}/sched/leader", encode(stale_claim)), True)])

    def repaired() -> bool:
        got = retained(c.port, [f"{ROOT}/sched/leader", f"{ROOT}/cluster/state"])
        try:
            lead = decode(got[f"{ROOT}/sched/leader"], LeaderClaim)
            snap = decode(got[f"{ROOT}/cluster/state"], ClusterState)
        except Exception:
            return False
        assert isinstance(lead, LeaderClaim) and isinstance(snap, ClusterState)
        return ((lead.id, lead.term) == (sched, term) and (snap.leader, snap.term) == (sched, term)
                and sorted(snap.nodes) == ids)
    wait_until(repaired, 20, "the scheduler to repair the retained claim and snapshot", every=0.3)

    # Nothing was corrupted: alive, same scheduler and term, same node table.
    for node in ids:
        assert c.nodes[node].alive(), f"{node} died; see {c.nodes[node].log}"
    assert wait_until(lambda: agreed(c, ids), 10, "agreement after the garbage") == (sched, term)
    for node in ids:
        rows = c.query(node, "nodes")
        assert [r["id"] for r in rows] == ids, rows
        assert {r["state"] for r in rows} == {"standby"}, rows
        dropped = counter(c, node, "rejected") + counter(c, node, "auth_failed")
        assert dropped > rejected_before[node]
        assert counter(c, node, "tick_errors") == 0
    for node in followers:
        # The stale snapshot reached the followers and was recognised as stale.
        assert counter(c, node, "stale_states") >= 1
    for node in ids:
        text = c.nodes[node].log.read_text(errors="replace")
        assert "dropped message on" in text
        assert "Traceback" not in text, f"{node} logged a traceback"


@pytest.mark.parametrize("broker", BROKERS)
def test_stale_command_is_fenced(make_cluster: MakeCluster, broker: str) -> None:
    c = make_cluster(3, broker)
    ids = c.node_ids
    sched, term = wait_until(lambda: agreed(c, ids), 25, "one scheduler")
    follower = next(n for n in ids if n != sched)
    before = counter(c, follower, "fenced")
    commands = counter(c, follower, "commands")
    topic = f"{ROOT}/node/{follower}/cmd"
    sign = signer(c)
    stale = Command(term=term - 1, leader=sched, seq=1, op="noop")
    publish_all(c.port, [(topic, sign(topic, encode(stale)), False)])
    wait_until(lambda: counter(c, follower, "fenced") == before + 1, 10, "the stale command fenced")
    # The current term but not the current leader: fenced too.
    usurper = Command(term=term, leader="node-0", seq=2, op="noop")
    publish_all(c.port, [(topic, sign(topic, encode(usurper)), False)])
    wait_until(lambda: counter(c, follower, "fenced") == before + 2, 10, "the usurper fenced")
    assert counter(c, follower, "commands") == commands, "a fenced command was acted on"
    assert wait_until(lambda: agreed(c, ids), 10, "agreement") == (sched, term)


# --- control socket -----------------------------------------------------------------------
class Line:
    """A raw connection to a control socket, one line in, one line out."""

    def __init__(self, path: Path) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.buf = b""

    def ask(self, raw: bytes) -> dict[str, Any] | None:
        """Send ``raw`` (a newline is added); return the decoded answer, or None on EOF."""
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            self.sock.sendall(raw + b"\n")
        while b"\n" not in self.buf:
            try:
                chunk = self.sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            if not chunk:
                return None
            self.buf += chunk
        line, _, self.buf = self.buf.partition(b"\n")
        answer = json.loads(line)
        assert isinstance(answer, dict)
        return answer

    def close(self) -> None:
        self.sock.close()


BAD_LINES: list[tuple[str, bytes]] = [
    ("not-json", b"hello, daemon"),
    ("not-utf8", b"\xff\xfe\xfd"),
    ("array", b'[{"op": "status"}]'),
    ("string", b'"status"'),
    ("no-op", b'{"v": 1, "args": {}}'),
    ("op-not-string", b'{"op": 5}'),
    ("unknown-op", b'{"v": 1, "op": "self-destruct", "args": {}}'),
    ("wrong-version", b'{"v": 2, "op": "status", "args": {}}'),
    ("since-negative", b'{"v": 1, "op": "events", "args": {"since": -1}}'),
    ("since-string", b'{"v": 1, "op": "events", "args": {"since": "0"}}'),
    ("limit-bool", b'{"v": 1, "op": "events", "args": {"limit": true}}'),
    ("args-list", b'{"v": 1, "op": "status", "args": [1, 2]}'),
    ("args-string", b'{"v": 1, "op": "status", "args": "all"}'),
    ("huge-int", b'{"v": 1, "op": "events", "args": {"since": ' + b"9" * 5000 + b"}}"),
]


def _check_error(answer: dict[str, Any] | None, what: str, code: str = "usage") -> None:
    assert answer is not None, f"{what}: the daemon hung up without an answer"
    assert answer.get("v") == 1 and answer.get("ok") is False, (what, answer)
    error = answer.get("error")
    assert isinstance(error, str) and error and "\n" not in error, (what, answer)
    assert "Traceback" not in error
    assert answer.get("code") == code, (what, answer)


def test_control_socket_garbage(make_cluster: MakeCluster) -> None:
    c = make_cluster(1, "mosquitto")
    node = c.node_ids[0]
    path = c.socket_of(node)
    wait_until(lambda: c.query(node, "status"), 15, "the daemon to answer")
    # One connection carries every bad request in turn and stays usable.
    conn = Line(path)
    try:
        for name, raw in BAD_LINES:
            _check_error(conn.ask(raw), name)
        answer = conn.ask(b'{"v": 1, "op": "status", "args": {}}')
        assert answer is not None and answer["ok"] and answer["data"]["node"] == node
        # A blank line is not a request either.
        _check_error(conn.ask(b""), "blank line")
    finally:
        conn.close()
    # A 100 KiB line: an error, then the daemon closes that connection only.
    conn = Line(path)
    try:
        long_line = b'{"v": 1, "op": "status", "args": {"pad": "' + b"x" * (100 * 1024) + b'"}}'
        _check_error(conn.ask(long_line), "100 KiB line")
    finally:
        conn.close()
    # A client that disconnects mid-line costs nothing.
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as half:
        half.connect(str(path))
        half.sendall(b'{"v": 1, "op": "sta')
    # Still alive, and a new connection is served normally.
    assert c.nodes[node].alive()
    st = wait_until(lambda: c.query(node, "status"), 5, "status after the garbage")
    assert st["node"] == node
    text = c.nodes[node].log.read_text(errors="replace")
    assert "control:" in text
    assert "Traceback" not in text


def test_control_socket_deep_nesting(make_cluster: MakeCluster) -> None:
    c = make_cluster(1, "mosquitto")
    node = c.node_ids[0]
    wait_until(lambda: c.query(node, "status"), 15, "the daemon to answer")
    conn = Line(c.socket_of(node))
    try:
        answer = conn.ask(b"[" * 5000)  # 5 KB, well under the 64 KiB line limit
    finally:
        conn.close()
    assert c.nodes[node].alive()
    assert c.query(node, "status") is not None
    _check_error(answer, "deeply nested JSON")
