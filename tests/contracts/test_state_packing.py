"""The retained snapshot's packed wire form (issue 12): thousands of nodes within the 256 KiB
message limit, lossless, signed like any message, and garbage is a MessageError."""

from __future__ import annotations

import base64
import dataclasses
import json
import random
import zlib
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.cluster.primitives import Negotiator, measured
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.errors import MessageError
from daemon.contracts.messages import (
    MAX_PAYLOAD,
    MAX_UNPACKED,
    PROTOCOL_VERSION,
    ClusterState,
    Event,
    LinkRecord,
    NodeRecord,
    Topics,
    decode,
    encode,
)
from daemon.contracts.policy import POLICY_KEEP
from daemon.contracts.signing import ControlAuth, control_key
from daemon.contracts.statepack import pack, unpack

pytestmark = pytest.mark.timeout(300)


def live_cluster(n: int, seed: int = 1) -> ClusterState:
    """A snapshot as a scheduler of ``n`` active nodes publishes it: nodes that joined over
    time on ephemeral ports, three links each with their own probe figures and times, a full
    policy history (the last nodes joined one per policy), per-node steps and heartbeats."""
    rng = random.Random(seed)
    clock = FakeClock()
    sched = Scheduler("n1", 3, None, clock)
    for i in range(1, n + 1):
        clock.advance(rng.uniform(0.5, 5.0))
        host = f"10.{i // 65536}.{i // 256 % 256}.{i % 256}"
        sched.set_node(f"n{i}", state="active", addr=host, incarnation=rng.randint(1, 3),
                       data_addr=f"{host}:{rng.randint(32768, 60999)}")
    for i in range(2, n + 1):
        for j in rng.sample(range(1, i), min(3, i - 1)):
            clock.advance(rng.uniform(0.0, 0.5))
            sched.links.append(LinkRecord(a=f"n{j}", b=f"n{i}", state="up",
                                          rtt_ms=measured(rng.uniform(0.1, 5.0)),
                                          bandwidth_mbps=measured(rng.uniform(100, 1000)),
                                          measured_at=sched.now_ms()))
    neg = Negotiator(sched, clock, lambda _node: 0)
    late = [f"n{i}" for i in range(max(2, n - POLICY_KEEP + 2), n + 1)]
    for node in late:
        sched.set_node(node, state="standby")
    neg.publish_policy(effective_step=0)
    for k, node in enumerate(late, start=1):
        clock.advance(2.0)
        sched.set_node(node, state="active")
        neg.publish_policy(effective_step=10 * k)
    sched.record("scale-out", node=late[-1], delay_ms=1234.5, policy_version=sched.policy_version)
    snap = sched.snapshot()
    wall = clock.wall()
    nodes = {k: dataclasses.replace(r, step=5000 - rng.randint(0, 1),
                                    heard_at=round(wall - rng.uniform(0, 0.5), 3))
             for k, r in snap.nodes.items()}
    return dataclasses.replace(snap, nodes=nodes, step=5000)


def test_5000_nodes_fit_and_round_trip() -> None:
    snap = live_cluster(5000)
    assert len(snap.policies) == POLICY_KEEP and len(snap.links) > 14_000
    data = encode(snap)
    assert len(data) <= MAX_PAYLOAD
    assert json.loads(data)["v"] == 2  # packed
    back = decode(data, ClusterState)
    assert back == snap
    # The policies a follower's workers take from it, unchanged.
    assert back.policy == snap.policy and back.policies == snap.policies
    assert [n.neighbors for n in back.nodes.values()] == [
        n.neighbors for n in snap.nodes.values()]


def test_signed_like_any_message() -> None:
    snap = live_cluster(300, seed=2)
    topic = Topics("lab").state
    auth = ControlAuth(control_key("s3cret", "lab"))
    sealed = auth.seal(topic, encode(snap), now=1.0e9)
    body = auth.open(topic, sealed, now=1.0e9 + 3600, retained=True, retainable=True)
    assert decode(body, ClusterState) == snap


def test_plain_snapshots_of_an_older_scheduler_still_decode() -> None:
    snap = live_cluster(40, seed=3)
    plain = {"v": PROTOCOL_VERSION, "kind": "state", **dataclasses.asdict(snap)}
    assert decode(json.dumps(plain).encode(), ClusterState) == snap


def test_a_snapshot_of_wrong_types_is_still_sent_and_refused_on_receipt() -> None:
    bad = ClusterState(term=1, leader="a", version=1,
                       nodes={"a": NodeRecord(state="active", addr=5)})  # type: ignore[arg-type]
    with pytest.raises(MessageError, match="expected a string"):
        decode(encode(bad))


names = st.sampled_from(["a", "b", "c", "node-7", "z9"])
floats = st.one_of(st.none(), st.floats(-1e12, 1e12, allow_nan=False),
                   st.integers(0, 2**40).map(lambda k: k / 1000))
opt_floats = st.one_of(st.none(), floats)
records = st.builds(
    NodeRecord, state=st.sampled_from(["active", "standby", "failed", "joining"]),
    addr=st.sampled_from(["", "10.0.0.1", "h"]), neighbors=st.lists(names, max_size=4),
    incarnation=st.integers(0, 9), joined_at=floats.filter(lambda x: x is not None),
    since=floats.filter(lambda x: x is not None), step=st.integers(0, 10**6),
    data_addr=st.sampled_from(["", "10.0.0.1:7000", "10.0.0.1:07", "h:1", "x:y", "10.0.0.1:"]),
    heard_at=opt_floats)
links = st.builds(LinkRecord, a=names, b=names, state=st.sampled_from(["up", "down"]),
                  rtt_ms=opt_floats, bandwidth_mbps=opt_floats, measured_at=opt_floats)
json_values = st.recursive(st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(
    max_size=3)), lambda kids: st.lists(kids, max_size=3) | st.dictionaries(
        st.text(max_size=3), kids, max_size=3), max_leaves=6)
policies = st.fixed_dictionaries(
    {}, optional={"version": st.integers(0, 9), "members": st.lists(names, max_size=5),
                  "edges": st.lists(st.lists(names, min_size=2, max_size=2), max_size=4),
                  "root": names, "addrs": st.dictionaries(names, st.sampled_from(
                      ["10.0.0.1:7000", "h:1", ""]), max_size=4),
                  "effective_step": st.integers(0, 9), "extra": json_values})
sorted_policies = policies.map(lambda p: {
    **p, **({"members": sorted(set(p["members"]))} if "members" in p else {}),
    **({"edges": sorted({tuple(e) for e in p["edges"]})} if "edges" in p else {})})
sorted_policies = sorted_policies.map(lambda p: {
    **p, **({"edges": [list(e) for e in p["edges"]]} if "edges" in p else {})})
states = st.builds(
    ClusterState, term=st.integers(0, 9), leader=names, version=st.integers(0, 99),
    nodes=st.dictionaries(names, records, max_size=5), links=st.lists(links, max_size=6),
    policy_version=st.integers(0, 9), step=st.integers(0, 99),
    events=st.lists(st.builds(Event, seq=st.integers(0, 9), ts=st.floats(0, 1e9),
                              kind=st.just("scale-out"), detail=st.dictionaries(
                                  st.text(max_size=3), json_values, max_size=2)), max_size=2),
    policy=st.one_of(policies, sorted_policies),
    policies=st.lists(st.one_of(policies, sorted_policies), max_size=4))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(states)
def test_any_snapshot_round_trips(snap: ClusterState) -> None:
    assert decode(encode(snap)) == snap


@settings(max_examples=50, deadline=None)
@given(states)
def test_the_same_policy_twice_is_sent_once(snap: ClusterState) -> None:
    snap = dataclasses.replace(snap, policy=snap.policies[-1] if snap.policies else {})
    assert decode(encode(snap)) == snap


def _packed(inner: Any) -> bytes:
    blob = base64.b85encode(zlib.compress(json.dumps(inner).encode())).decode()
    return json.dumps({"v": 2, "kind": "state", "term": 1, "leader": "a", "version": 1,
                       "z": blob}).encode()


def _mutations(doc: Any, rng: random.Random) -> Any:
    """``doc`` with one value somewhere replaced by something of another shape."""
    if isinstance(doc, dict) and doc:
        key = rng.choice(sorted(doc))
        return {**doc, key: _mutations(doc[key], rng)}
    if isinstance(doc, list) and doc:
        i = rng.randrange(len(doc))
        return [*doc[:i], _mutations(doc[i], rng), *doc[i + 1:]]
    return rng.choice([None, -1, 10**9, "x", [], {}, [1, 2, 3], {"all": [1]}, True, 0.5])


def test_malformed_packed_snapshots_are_message_errors() -> None:
    snap = live_cluster(30, seed=4)
    doc = dataclasses.asdict(snap)
    inner = pack({k: doc[k] for k in ("nodes", "links", "events", "policy", "policies")})
    assert unpack(inner)["nodes"] == doc["nodes"]
    rng = random.Random(5)
    for _ in range(400):
        try:
            got = decode(_packed(_mutations(inner, rng)))
        except MessageError:
            continue
        assert isinstance(got, ClusterState)  # some mutations are still a valid state


@pytest.mark.parametrize("z", ["", "not base85 \\", "ABCDE", base64.b85encode(b"xx").decode(),
                               base64.b85encode(zlib.compress(b"[1]")).decode(),
                               base64.b85encode(zlib.compress(b"{}")).decode(),
                               base64.b85encode(zlib.compress(b"{")[:-3]).decode()])
def test_bad_blobs_are_message_errors(z: str) -> None:
    payload = json.dumps({"v": 2, "kind": "state", "term": 1, "leader": "a", "version": 1,
                          "z": z}).encode()
    with pytest.raises(MessageError):
        decode(payload)


def test_an_inflation_bomb_is_refused() -> None:
    bomb = zlib.compress(b" " * (MAX_UNPACKED + 1), 9)
    assert len(bomb) < MAX_PAYLOAD // 2
    payload = json.dumps({"v": 2, "kind": "state", "term": 1, "leader": "a", "version": 1,
                          "z": base64.b85encode(bomb).decode()}).encode()
    with pytest.raises(MessageError, match="over"):
        decode(payload)


def test_version_2_is_only_the_packed_state() -> None:
    with pytest.raises(MessageError, match="version"):
        decode(b'{"v": 2, "kind": "hb", "z": ""}')
    with pytest.raises(MessageError, match="without 'z'"):
        decode(b'{"v": 2, "kind": "state", "term": 1, "leader": "a", "version": 1}')
