"""Every request, command and report body: built and parsed in one place, fuzzed.

Each body is a frozen record that owns its wire form (``to_args``); the parse functions are
the one place that reads one back. Hypothesis builds random valid records (their wire form
must parse back to the same record) and random garbage (it must be refused with a
``MessageError``, never another exception and never a half-built record).
"""

from __future__ import annotations

import contextlib
import json
import string
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from daemon.contracts import kinds
from daemon.contracts.errors import MessageError
from daemon.contracts.protocol import (
    COMMANDS,
    REPORTS,
    REQUESTS,
    WORKER_COMMANDS,
    WORKER_REPORTS,
    Bootstrap,
    Connect,
    Disconnect,
    JoinRequest,
    LeaveRequest,
    LinkEstimate,
    LinkFailed,
    LinkMetrics,
    LinkRecovered,
    LinkRequest,
    PlanInputRecord,
    Replicate,
    Replicated,
    Reply,
    RoundAborted,
    ServeDeclined,
    SourceStats,
    Stall,
    StateDiverged,
    StateRefused,
    WorkerExit,
    parse_command,
    parse_report,
    parse_request,
    parse_worker_command,
)

pytestmark = pytest.mark.timeout(120)

ids = st.text(string.ascii_lowercase + string.digits + "-_.", min_size=1, max_size=12).filter(
    lambda s: s[0].isalnum())
addrs = st.builds(lambda h, p: f"{h}:{p}", st.sampled_from(["127.0.0.1", "10.0.0.7", "box-1"]),
                  st.integers(1, 65535))
nums = st.floats(0, 1e6, allow_nan=False, allow_infinity=False)
text = st.text(max_size=40)
digests = st.text("0123456789abcdef", min_size=64, max_size=64)
steps = st.integers(0, 10**9)


def _replicate(new: str, sources: dict[str, str], **rest: Any) -> Replicate:
    sources.pop(new, None)
    return Replicate(new=new, sources=sources or {"src": "127.0.0.1:1"}, **rest)


BODIES = st.one_of(
    st.builds(JoinRequest, addr=addrs, neighbors=st.lists(ids, max_size=4),
              rtts=st.dictionaries(ids, nums, max_size=4)),
    st.builds(LeaveRequest, step=steps),
    st.builds(LinkRequest, peer=ids, action=st.sampled_from(["add", "del"])),
    st.builds(WorkerExit, code=st.integers(-255, 255),
              reason=st.sampled_from(kinds.WORKER_EXIT_REASONS)),
    st.builds(LinkFailed, peer=ids, reason=text),
    st.builds(LinkRecovered, peer=ids),
    st.builds(LinkMetrics, peer=ids, rtt_ms=st.none() | nums, bandwidth_mbps=st.none() | nums),
    st.builds(RoundAborted, step=steps, reason=text),
    st.builds(Stall, step=steps, ms=nums, reruns=st.integers(0, 9), policy_version=steps,
              reason=text),
    st.builds(ServeDeclined, new=ids, reason=text),
    st.builds(StateDiverged, step=steps, digest=digests, majority=digests,
              variants=st.integers(2, 9)).filter(lambda s: s.digest != s.majority),
    st.builds(StateRefused, reason=text),
    st.builds(Replicated, version=steps, bytes=st.none() | steps, delay_ms=st.none() | nums,
              sources=st.lists(ids, max_size=3),
              per_source=st.dictionaries(ids, st.builds(SourceStats, bytes=steps,
                                                        end_s=st.none() | nums,
                                                        failed=st.none() | text), max_size=3),
              plan_inputs=st.lists(st.builds(PlanInputRecord, id=ids, t_prop_s=nums,
                                             t_trans_s_per_byte=nums, tau_sync_s=nums),
                                   max_size=3),
              left_out=st.dictionaries(ids, text, max_size=2),
              declined=st.dictionaries(ids, text, max_size=2)),
    st.builds(Connect, peer=ids, addr=addrs),
    st.builds(Disconnect, peer=ids),
    st.builds(_replicate, version_step=steps, new=ids,
              sources=st.dictionaries(ids, addrs, min_size=1, max_size=3),
              policy_version=steps, neighbors=st.lists(ids, max_size=3),
              strategy=st.sampled_from(["chaos", "single"]),
              links=st.dictionaries(ids, st.builds(LinkEstimate, rtt_ms=st.none() | nums,
                                                   bandwidth_mbps=st.none() | nums),
                                    max_size=3)),
    st.builds(Bootstrap, new=ids, policy_version=steps),
    st.builds(Reply, req_id=text, error=st.none() | text),
)


def _parse(body: Any, args: Any) -> Any:
    if body.OP in COMMANDS:
        return parse_command(body.OP, args)
    return parse_request(body.OP, args)


@settings(max_examples=400, deadline=None)
@given(BODIES)
def test_every_body_survives_its_own_wire_form(body: Any) -> None:
    args = json.loads(json.dumps(body.to_args()))  # what actually travels: JSON
    assert _parse(body, args) == body


def test_the_registries_match_the_names_every_process_shares() -> None:
    assert set(COMMANDS) == set(kinds.COMMAND_OPS)
    assert set(WORKER_COMMANDS) == set(kinds.WORKER_COMMAND_OPS)
    assert set(REPORTS) == set(kinds.REPORT_KINDS)
    assert set(WORKER_REPORTS) == set(kinds.WORKER_REPORT_KINDS)
    assert {*REQUESTS, "report"} == set(kinds.REQUEST_OPS)


JSON = st.recursive(st.none() | st.booleans() | st.integers() | nums | text,
                    lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(text, inner, max_size=4), max_leaves=12)


@settings(max_examples=500, deadline=None)
@given(st.sampled_from([*COMMANDS, *REQUESTS, "report", "nope"]), JSON)
def test_garbage_is_refused_in_one_place(op: str, args: Any) -> None:
    """Anything but a valid body is a MessageError: never another exception."""
    for parse in (parse_command, parse_request, parse_worker_command):
        with contextlib.suppress(MessageError):
            parse(op, args)


@settings(max_examples=300, deadline=None)
@given(BODIES, st.data())
def test_a_body_with_one_field_broken_is_refused(body: Any, data: st.DataObject) -> None:
    """Change one field of a valid body to a value of the wrong kind: refused, by name."""
    args = body.to_args()
    keys = [k for k in args if k != "kind"]
    if not keys:
        return
    key = data.draw(st.sampled_from(keys))
    args[key] = data.draw(st.sampled_from([{"x": [1]}, [[]], "\u0000" * 3, -1.5e300]))
    try:
        parsed = _parse(body, args)
    except MessageError as exc:
        assert key in str(exc) or "addr" in str(exc) or "id" in str(exc)
        return
    # A few fields take any string or number; the body then stays a valid record of its type.
    assert type(parsed) is type(body)


@pytest.mark.parametrize(("op", "args", "error"), [
    ("replicate", {"version_step": 3, "new": "c", "sources": {}, "policy_version": 1},
     "at least one source"),
    ("replicate", {"version_step": 3, "new": "c", "sources": {"c": "h:1"}, "policy_version": 1},
     "its own source"),
    ("replicate", {"version_step": -1, "new": "c", "sources": {"b": "h:1"}, "policy_version": 1},
     "version_step"),
    ("connect", {"peer": "b", "addr": ""}, "not host:port"),
    ("connect", {"peer": "b", "addr": "host:0"}, "not host:port"),
    ("connect", {"peer": "../b", "addr": "h:1"}, "bad node id"),
    ("bootstrap", {"new": "c"}, "missing field 'policy_version'"),
    ("dance", {}, "unknown command"),
])
def test_malformed_commands_name_what_is_wrong(op: str, args: dict[str, Any],
                                               error: str) -> None:
    with pytest.raises(MessageError, match=error):
        parse_command(op, args)


def test_a_worker_gets_no_reply_commands_and_reports_only_its_kinds() -> None:
    with pytest.raises(MessageError, match="unknown command"):
        parse_worker_command("reply", {"req_id": "r"})
    with pytest.raises(MessageError, match="unknown report kind"):
        parse_report({"kind": "link-metrics", "peer": "b"}, WORKER_REPORTS)
    assert parse_report({"kind": "link-metrics", "peer": "b"}) == LinkMetrics(peer="b")
