"""The authenticated decoder (daemon.contracts.signing), fuzzed as round 1 fuzzed the plain one.

Truncated signatures, a wrong key, replays, flipped bytes, moved topics, stale timestamps and
oversized payloads: the layer raises :class:`AuthError` and nothing else, and through a real
:class:`NodeAgent` none of them changes any state the node acts on.
"""

from __future__ import annotations

import contextlib
import copy
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from daemon.agent.node import NodeAgent
from daemon.contracts.config import Config
from daemon.contracts.errors import MessageError
from daemon.contracts.messages import (
    MAX_PAYLOAD,
    ClusterState,
    Command,
    Heartbeat,
    LeaderClaim,
    NodeRecord,
    Request,
    Status,
    Topics,
    decode,
    encode,
)
from daemon.contracts.signing import MAX_BODY, MAX_SEALED, AuthError, ControlAuth, control_key

pytestmark = pytest.mark.timeout(120)
SECRET = "unit-test-cluster-secret-0123456789"
T = Topics("t")
NOW = 1_700_000_000.0
KEY = control_key(SECRET, "t")

SAMPLES: list[tuple[str, Any]] = [
    (T.hb("n2"), Heartbeat(node="n2", seq=5, incarnation=7, step=3, state="active",
                           cpu_percent=1.0, mem_percent=2.0)),
    (T.status("n2"), Status(node="n2", online=True, reason="up", incarnation=7, addr="10.0.0.2")),
    (T.leader, LeaderClaim(id="n2", term=999)),
    (T.req, Request(node="n2", req_id="n2-1", op="leave")),
    (T.cmd("n1"), Command(term=999, leader="n2", seq=1, op="disconnect", args={"peer": "n3"})),
    (T.state, ClusterState(term=999, leader="n2", version=3,
                           nodes={"n2": NodeRecord(state="active")})),
]


def auth() -> ControlAuth:
    return ControlAuth(KEY, window_s=60.0)


def test_round_trip_every_kind() -> None:
    a = auth()
    for topic, msg in SAMPLES:
        sealed = a.seal(topic, encode(msg), NOW)
        assert decode(a.open(topic, sealed, NOW + 1)) == msg


def test_keys_are_distinct() -> None:
    cfg = Config(node_id="n1", cluster="t", secret=SECRET)
    assert cfg.control_key == KEY and cfg.control_key != cfg.data_key
    assert control_key(SECRET, "other") != KEY
    assert Config(node_id="n1", cluster="t", secret=SECRET, insecure=True).control_key is None


@pytest.mark.parametrize(("case", "reason"), [
    ("wrong-key", "bad-signature"), ("other-topic", "bad-signature"), ("unsigned", "unsigned"),
    ("stale", "stale"), ("future", "stale"), ("replay", "replayed"),
    ("retained-cmd", "retained"), ("oversized", "oversized"),
])
def test_each_refusal_has_its_reason(case: str, reason: str) -> None:
    a = auth()
    topic, msg = SAMPLES[4]
    body = encode(msg)
    payload, at, kw = a.seal(topic, body, NOW), NOW, {}
    if case == "wrong-key":
        payload = ControlAuth(control_key("another-secret-entirely", "t")).seal(topic, body, NOW)
    elif case == "other-topic":
        topic = T.cmd("n3")
    elif case == "unsigned":
        payload = body
    elif case == "stale":
        at = NOW + 61
    elif case == "future":
        at = NOW - 61
    elif case == "replay":
        a.open(topic, payload, NOW)
    elif case == "retained-cmd":
        kw = {"retained": True, "retainable": False}
    elif case == "oversized":
        payload = b"{" + b" " * MAX_SEALED + payload[1:]
    with pytest.raises(AuthError) as err:
        a.open(topic, payload, at, **kw)
    assert err.value.reason == reason


def test_retained_copies_skip_the_window_on_retained_topics_only() -> None:
    a = auth()
    old = a.seal(T.leader, encode(SAMPLES[2][1]), NOW - 86400)
    assert a.open(T.leader, old, NOW, retained=True, retainable=True)
    assert a.open(T.leader, old, NOW, retained=True, retainable=True)  # every reconnect
    with pytest.raises(AuthError):
        a.open(T.leader, old, NOW)  # live: stale


def test_the_largest_message_still_fits() -> None:
    assert MAX_BODY == MAX_PAYLOAD
    a = auth()
    body = b'{"v":1,"kind":"req","pad":"' + b"x" * (MAX_PAYLOAD - 40) + b'"}'
    assert len(body) <= MAX_PAYLOAD
    assert a.open(T.req, a.seal(T.req, body, NOW), NOW) == body


# --- fuzzing the layer --------------------------------------------------------------------
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=600), st.booleans(), st.booleans())
def test_fuzz_bytes_raise_only_auth_errors(payload: bytes, retained: bool, ok: bool) -> None:
    with pytest.raises(AuthError):
        auth().open(T.leader, payload, NOW, retained=retained, retainable=ok)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from(SAMPLES), st.data())
def test_fuzz_flipped_and_truncated(sample: tuple[str, Any], data: st.DataObject) -> None:
    topic, msg = sample
    a = auth()
    sealed = a.seal(topic, encode(msg), NOW)
    how = data.draw(st.sampled_from(["flip", "truncate", "truncate-sig", "insert"]))
    if how == "flip":
        i = data.draw(st.integers(0, len(sealed) - 1))
        bit = data.draw(st.integers(0, 7))
        bad = sealed[:i] + bytes([sealed[i] ^ (1 << bit)]) + sealed[i + 1:]
    elif how == "truncate":
        bad = sealed[:data.draw(st.integers(0, len(sealed) - 1))]
    elif how == "truncate-sig":  # keep the frame, cut hex digits out of the signature
        cut = data.draw(st.integers(1, 63))
        bad = sealed[:-2 - cut] + b'"}'
    else:
        i = data.draw(st.integers(0, len(sealed)))
        bad = sealed[:i] + data.draw(st.binary(min_size=1, max_size=8)) + sealed[i:]
    with pytest.raises(AuthError):
        a.open(topic, bad, NOW)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_fuzz_signed_garbage_reaches_the_decoder_safely(body: bytes) -> None:
    # A holder of the key may still send nonsense: the decoder's own error, nothing else.
    a = auth()
    with contextlib.suppress(AuthError):
        opened = a.open(T.req, a.seal(T.req, b"{" + body + b"}", NOW), NOW)
        with contextlib.suppress(MessageError):
            decode(opened)


# --- through a real node: nothing changes ---------------------------------------------------
def _state(agent: NodeAgent) -> Any:
    el = agent.election
    return copy.deepcopy((el.term, el.leader, agent.presence, agent.beats, agent.view,
                          agent.policies, agent._replies, agent.worker.drain(),
                          agent.detector.known(), agent._wills))


def _agent() -> NodeAgent:
    cfg = Config(node_id="n1", cluster="t", secret=SECRET, data_dir="/nonexistent")
    return NodeAgent(cfg)


def _forgeries(data: st.DataObject) -> list[tuple[str, bytes, bool]]:
    wrong = ControlAuth(control_key("a-secret-the-cluster-never-had", "t"))
    real = ControlAuth(KEY)
    out = []
    for topic, msg in SAMPLES:
        body = encode(msg)
        now = time.time()
        choice = data.draw(st.sampled_from(["plain", "wrong", "stale", "flip", "cut", "moved"]))
        if choice == "plain":
            payload = body
        elif choice == "wrong":
            payload = wrong.seal(topic, body, now)
        elif choice == "stale":
            payload = real.seal(topic, body, now - data.draw(st.floats(61, 1e6)))
        elif choice == "flip":
            sealed = real.seal(topic, body, now)
            i = data.draw(st.integers(0, len(sealed) - 1))
            payload = sealed[:i] + bytes([sealed[i] ^ 0x20]) + sealed[i + 1:]
        elif choice == "cut":
            sealed = real.seal(topic, body, now)
            payload = sealed[:data.draw(st.integers(1, len(sealed) - 1))]
        else:
            payload = real.seal(T.cmd("n9") if topic != T.cmd("n9") else T.req, body, now)
        retained = data.draw(st.booleans()) and choice != "stale"
        out.append((topic, payload, retained))
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_fuzz_forgeries_never_change_a_node(data: st.DataObject) -> None:
    agent = _agent()
    # A known scheduler and a peer, so that there is state to corrupt.
    real = ControlAuth(KEY)
    now = time.time()
    agent.bus.deliver(T.leader, real.seal(T.leader, encode(LeaderClaim(id="n3", term=4)), now))
    agent.bus.deliver(T.hb("n3"), real.seal(T.hb("n3"), encode(Heartbeat(
        node="n3", seq=1, incarnation=1, step=0, state="standby", cpu_percent=0,
        mem_percent=0)), now))
    assert (agent.election.term, agent.election.leader) == (4, "n3")
    before = _state(agent)
    failed = agent.counters["auth_failed"]
    forged = _forgeries(data)
    for topic, payload, retained in forged:
        agent.bus.deliver(topic, payload, retained=retained)
    assert _state(agent) == before
    assert agent.counters["auth_failed"] == failed + len(forged)
    assert agent.counters["commands"] == 0


def test_replayed_signed_messages_are_refused_by_a_node() -> None:
    agent = _agent()
    real = ControlAuth(KEY)
    claim = real.seal(T.leader, encode(LeaderClaim(id="n3", term=4)), time.time())
    cmd_body = encode(Command(term=4, leader="n3", seq=1, op="connect",
                              args={"peer": "n3", "addr": "10.0.0.3:7000"}))
    cmd = real.seal(T.cmd("n1"), cmd_body, time.time())
    agent.bus.deliver(T.leader, claim)
    agent.bus.deliver(T.cmd("n1"), cmd)
    assert agent.counters["commands"] == 1
    agent.bus.deliver(T.cmd("n1"), cmd)                  # at once
    agent.bus.deliver(T.cmd("n1"), cmd, retained=True)   # left retained on the broker
    old = real.seal(T.cmd("n1"), cmd_body, time.time() - 3600)
    agent.bus.deliver(T.cmd("n1"), old)                  # an old capture
    assert agent.counters["commands"] == 1
    assert agent.counters["auth_replayed"] == 1
    assert agent.counters["auth_retained"] == 1
    assert agent.counters["auth_stale"] == 1


def test_insecure_node_accepts_plain_messages() -> None:
    cfg = Config(node_id="n1", cluster="t", insecure=True, data_dir="/nonexistent")
    agent = NodeAgent(cfg)
    assert agent.bus.auth is None
    agent.bus.deliver(T.leader, encode(LeaderClaim(id="n3", term=4)))
    assert agent.election.leader == "n3"
