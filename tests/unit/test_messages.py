"""Message codecs: round trips, and a fuzz test that garbage is always a MessageError."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.contracts.errors import MessageError
from daemon.contracts.messages import (
    MAX_PAYLOAD,
    ClusterState,
    Command,
    Event,
    Heartbeat,
    LeaderClaim,
    LinkRecord,
    NodeRecord,
    Request,
    Status,
    Topics,
    decode,
    encode,
)

pytestmark = pytest.mark.timeout(120)
SAMPLES = [
    Heartbeat(node="n1", seq=3, incarnation=9, step=10, state="active", cpu_percent=1.5,
              mem_percent=20.0, battery_percent=None),
    Status(node="n1", online=False, reason="lost", incarnation=9, addr="10.0.0.1", ts=1.0),
    LeaderClaim(id="n2", term=4, ts=2.0),
    Request(node="n3", req_id="r1", op="join", args={"neighbors": ["n1"]}),
    Command(term=4, leader="n2", seq=1, op="connect", args={"peer": "n1"}),
    ClusterState(term=4, leader="n2", version=7,
                 nodes={"n1": NodeRecord(state="active", neighbors=["n2"])},
                 links=[LinkRecord(a="n1", b="n2", state="up", rtt_ms=0.3)],
                 events=[Event(seq=1, ts=3.0, kind="node-failed", node="n3", delay_ms=2.0,
                               detail={"reason": "heartbeat"})]),
]


@pytest.mark.parametrize("msg", SAMPLES, ids=lambda m: m.KIND)
def test_round_trip(msg: object) -> None:
    assert decode(encode(msg)) == msg  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("payload", "reason"),
    [
        (b"", "not JSON"),
        (b"\xff\xfe", "not JSON"),
        (b"[1]", "not a JSON object"),
        (b'{"v": 2, "kind": "hb"}', "version"),
        (b'{"kind": "hb"}', "version"),
        (b'{"v": 1, "kind": "nope"}', "unknown kind"),
        (b'{"v": 1, "kind": "leader", "id": "a"}', "missing field 'term'"),
        (b'{"v": 1, "kind": "leader", "id": "a", "term": "1"}', "integer"),
        (b'{"v": 1, "kind": "leader", "id": "a", "term": true}', "integer"),
        (b'{"v": 1, "kind": "leader", "id": "a", "term": -1}', "negative"),
        (b'{"v": 1, "kind": "leader", "id": "a/b", "term": 1}', "bad node id"),
        (b'{"v": 1, "kind": "leader", "id": "a", "term": 1, "ts": Infinity}', "not JSON"),
        (b'{"v": 1, "kind": "state", "term": 1, "leader": "a", "version": 1,'
         b' "nodes": {"x": {"state": "zombie"}}}', "unknown node state"),
        (b'{"v": 1, "kind": "state", "term": 1, "leader": "a", "version": 1,'
         b' "nodes": {"x y": {"state": "active"}}}', "bad node id"),
        (b"[" * 100000, "not JSON"),
    ],
)
def test_rejects(payload: bytes, reason: str) -> None:
    with pytest.raises(MessageError, match=reason):
        decode(payload)


def test_oversized_is_rejected_before_parsing() -> None:
    with pytest.raises(MessageError, match="exceeds"):
        decode(b" " * (MAX_PAYLOAD + 1))


def test_expected_kind_is_enforced() -> None:
    with pytest.raises(MessageError, match="expected"):
        decode(encode(SAMPLES[2]), expect=Heartbeat)


def test_unknown_extra_fields_are_ignored() -> None:
    body = json.loads(encode(SAMPLES[2]))
    body["future_field"] = [1, 2]
    assert decode(json.dumps(body)) == SAMPLES[2]


def test_topics() -> None:
    t = Topics("lab")
    assert t.hb("n1") == "chaos/lab/node/n1/hb"
    assert t.node_of("chaos/lab/node/n1/cmd") == "n1"
    assert t.node_of("chaos/lab/sched/leader") is None
    assert t.state == "chaos/lab/cluster/state" and t.leader == "chaos/lab/sched/leader"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=512))
def test_fuzz_bytes_never_crash(payload: bytes) -> None:
    with contextlib.suppress(MessageError):
        decode(payload)


@settings(max_examples=400, deadline=None)
@given(kind=st.sampled_from(["hb", "status", "leader", "req", "cmd", "state"]),
       body=st.dictionaries(st.sampled_from(
           ["node", "id", "term", "seq", "state", "nodes", "links", "events", "online", "op",
            "args", "leader", "version", "incarnation", "step", "reason", "req_id",
            "cpu_percent", "mem_percent"]), json_values, max_size=12))
def test_fuzz_structured_payloads_never_crash(kind: str, body: dict[str, object]) -> None:
    payload = json.dumps({"v": 1, "kind": kind, **body})
    with contextlib.suppress(MessageError):
        decode(payload)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_mutated_valid_messages(msg: object, data: st.DataObject) -> None:
    body = json.loads(encode(msg))  # type: ignore[arg-type]
    key = data.draw(st.sampled_from(sorted(body)))
    body[key] = data.draw(json_values)
    try:
        out = decode(json.dumps(body))
    except MessageError:
        return
    assert out.KIND == msg.KIND  # type: ignore[attr-defined]
