"""SyncPolicy validation/serialisation and spanning-tree planning properties."""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import replace
from types import SimpleNamespace
from typing import Any, cast

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos_edge.dataplane.errors import PolicyError
from daemon.cluster.primitives import Negotiator
from daemon.cluster.role import SchedulerRole
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import Config, TrainingConfig
from daemon.contracts.messages import Heartbeat, LinkRecord, Status
from daemon.contracts.policy import (
    WIRE_FORMATS,
    Edge,
    SyncPolicy,
    chunk_for_rate,
    parse,
    spanning_tree,
)
from daemon.contracts.protocol import Replicated

pytestmark = pytest.mark.timeout(60)


def _path(edges: tuple[Edge, ...], a: str, b: str) -> list[Edge]:
    adj: dict[str, list[str]] = {}
    for x, y in edges:
        adj.setdefault(x, []).append(y)
        adj.setdefault(y, []).append(x)
    prev: dict[str, str | None] = {a: None}
    queue = deque([a])
    while queue:
        n = queue.popleft()
        for m in adj.get(n, []):
            if m not in prev:
                prev[m] = n
                queue.append(m)
    out, n = [], b
    while prev[n] is not None:
        p = prev[n]
        assert p is not None
        out.append((min(n, p), max(n, p)))
        n = p
    return out


def _height(edges: tuple[Edge, ...], root: str, nodes: frozenset[str]) -> int:
    return max(len(_path(edges, root, n)) for n in nodes)


graphs = st.integers(1, 8).flatmap(
    lambda n: st.tuples(
        st.just([f"n{i}" for i in range(n)]),
        st.dictionaries(
            st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)).map(
                lambda t: (f"n{t[0]}", f"n{t[1]}")
            ),
            st.sampled_from([10.0, 50.0, 100.0, 1000.0]),
            max_size=14,
        ),
    )
)


@settings(max_examples=150, deadline=None)
@given(graphs)
def test_spanning_tree_properties(graph: tuple[list[str], dict[Edge, float]]) -> None:
    nodes, links = graph
    plan = spanning_tree(nodes, links)
    # The components partition the members, largest first.
    assert sorted(itertools.chain.from_iterable(plan.components)) == sorted(nodes)
    assert [len(c) for c in plan.components] == sorted(
        (len(c) for c in plan.components), reverse=True
    )
    main = plan.components[0]
    for a, b in links:  # no link crosses two components
        assert any(a in c and b in c for c in plan.components)
    # A tree over the largest component, rooted at a centre.
    policy = plan.policy(version=3)
    assert set(policy.members) == set(main) and len(policy.edges) == len(main) - 1
    best = min(_height(plan.edges, r, main) for r in main)
    assert _height(plan.edges, plan.root, main) == best
    # Maximum-bandwidth: every non-tree link is no wider than the tree path's bottleneck.
    bw: dict[Edge, float] = {}
    for (a, b), v in links.items():  # both directions given: the narrower one counts
        if a != b:
            bw[(min(a, b), max(a, b))] = min(v, bw.get((min(a, b), max(a, b)), v))
    for (a, b), v in bw.items():
        if a in main and (a, b) not in plan.edges:
            assert v <= min(bw[e] for e in _path(plan.edges, a, b))


def test_disconnected_graph_reports_components() -> None:
    plan = spanning_tree(
        ["a", "b", "c", "d", "e"], {("a", "b"): 1.0, ("b", "c"): 2.0, ("d", "e"): 5.0}
    )
    assert not plan.connected
    assert plan.components == (frozenset("abc"), frozenset("de"))
    assert plan.root == "b" and plan.edges == (("a", "b"), ("b", "c"))


def test_prefers_wide_links_and_is_deterministic() -> None:
    links = {
        ("a", "b"): 100.0,
        ("b", "c"): 100.0,
        ("a", "c"): 10.0,
        ("c", "d"): 1000.0,
        ("x", "a"): 1.0,
    }
    plan = spanning_tree(["d", "c", "b", "a"], links)
    assert plan.connected and plan.edges == (("a", "b"), ("b", "c"), ("c", "d"))
    assert plan.root in ("b", "c") and spanning_tree(["a", "b", "c", "d"], links) == plan


def test_policy_json_round_trip_and_tree_navigation() -> None:
    p = SyncPolicy.build(4, ["n2", "n0", "n1"], [("n1", "n0"), ("n1", "n2")], "n1")
    assert SyncPolicy.from_json(p.to_json()) == p
    assert p.parent("n1") is None and p.children("n1") == ("n0", "n2")
    assert p.parent("n2") == "n1" and p.children("n2") == ()


@pytest.mark.parametrize(
    "doc",
    [
        '{"version": 1, "members": ["a", "b"], "edges": [], "root": "a"}',
        '{"version": 1, "members": ["a", "b", "c"], "edges": [["a","b"],["b","a"]], "root": "a"}',
        '{"version": 1, "members": ["a", "b"], "edges": [["a","b"]], "root": "z"}',
        '{"version": 1, "members": ["a"], "edges": [["a","q"]], "root": "a"}',
        '{"version": "x"}',
        "[1, 2]",
        "not json",
    ],
)
def test_invalid_policies_are_rejected(doc: str) -> None:
    with pytest.raises(PolicyError):
        SyncPolicy.from_json(doc)


@pytest.mark.parametrize("wire", WIRE_FORMATS)
def test_policy_carries_its_wire_format(wire: str) -> None:
    p = SyncPolicy.build(2, ["a", "b"], [("a", "b")], "a", wire=wire)
    doc = p.to_dict()
    assert doc["wire"] == wire
    assert SyncPolicy.from_json(p.to_json()) == p and parse(doc) == p
    assert spanning_tree(["a", "b"], {("a", "b"): 1.0}).policy(2, wire=wire) == p


def test_a_policy_without_a_wire_format_is_fp32_and_an_unknown_one_is_refused() -> None:
    doc = SyncPolicy.build(2, ["a", "b"], [("a", "b")], "a", wire="int8").to_dict()
    old = {k: v for k, v in doc.items() if k != "wire"}  # from a scheduler before the field
    assert SyncPolicy.from_dict(old).wire == "fp32" and SyncPolicy.from_dict(old) != parse(doc)
    with pytest.raises(PolicyError, match="fp32, fp16, bf16, int8"):
        SyncPolicy.build(2, ["a", "b"], [("a", "b")], "a", wire="int4")
    with pytest.raises(PolicyError, match="wire format 'int4'"):
        SyncPolicy.from_dict({**doc, "wire": "int4"})
    assert parse({**doc, "wire": "int4"}) is None  # dropped where it arrives, never a crash


def test_the_scheduler_puts_one_wire_format_in_every_policy() -> None:
    clock = FakeClock()
    neg = Negotiator(Scheduler("s", 1, None, clock), clock, lambda _n: 0)
    neg.join("a", "127.0.0.1:1", [])
    assert neg.sched.policy is not None and neg.sched.policy.wire == "fp32"  # the default
    # The elected role takes the format from its node's [training] wire.
    cfg = replace(Config(node_id="s", cluster="t"), training=TrainingConfig(wire="bf16"))
    host = SimpleNamespace(
        me="s", cfg=cfg, clock=clock, election=SimpleNamespace(term=1), view=None,
        presence={}, step_of=lambda _n: 0, reported_step=lambda _n: 0, heard_steps=dict,
        daemon_alive=lambda _n: True, view_outdated=lambda: False,
        own_status=lambda: Status(node="s", online=True, reason="up", incarnation=1, addr="x"),
        own_heartbeat=lambda: Heartbeat(node="s", seq=1, incarnation=1, step=0,
                                        state="standby", cpu_percent=0.0, mem_percent=0.0),
    )
    role = SchedulerRole(cast(Any, host), None)
    role.neg.join("a", "127.0.0.1:1", [])
    role.neg.join("b", "127.0.0.1:2", [])
    role.neg.replicated("b", Replicated(version=0))
    role.neg.gone("a", "failure")
    snap = role.snapshot()
    assert len(snap.policies) >= 3
    assert snap.policy["wire"] == "bf16" and {d["wire"] for d in snap.policies} == {"bf16"}


def test_a_policy_carries_its_chunk_size_and_refuses_a_bad_one() -> None:
    p = SyncPolicy.build(2, ["a", "b"], [("a", "b")], "a", chunk_kib=128)
    assert p.to_dict()["chunk_kib"] == 128 and parse(p.to_dict()) == p
    old = {k: v for k, v in p.to_dict().items() if k != "chunk_kib"}  # an older scheduler's
    assert SyncPolicy.from_dict(old).chunk_kib == 0
    for bad in (3, 32, 100, 2048):
        with pytest.raises(PolicyError, match=f"^chunk_kib {bad} is not 0 or a power of two"):
            SyncPolicy.build(2, ["a", "b"], [("a", "b")], "a", chunk_kib=bad)


@pytest.mark.parametrize(("mbit", "kib"), [(None, 0), (10.0, 64), (50.0, 64), (500.0, 128),
                                           (1000.0, 256), (2000.0, 512), (10_000.0, 0)])
def test_a_chunk_takes_a_few_milliseconds_on_the_slowest_link(mbit: float | None,
                                                              kib: int) -> None:
    assert chunk_for_rate(mbit) == kib


def _active(nodes: str) -> Negotiator:
    """A scheduler's negotiator with ``nodes`` (one letter each) active."""
    clock = FakeClock()
    sched = Scheduler(nodes[0], 1, None, clock)
    for i, n in enumerate(nodes):
        sched.set_node(n, state="active", addr=f"10.0.0.{i}", data_addr=f"10.0.0.{i}:7000",
                       incarnation=1)
    return Negotiator(sched, clock, lambda _node: 0)


def test_the_scheduler_sizes_chunks_by_the_slowest_measured_tree_link() -> None:
    neg = _active("abc")
    sched = neg.sched
    sched.links += [LinkRecord(a="a", b="b", state="up", bandwidth_mbps=50.0),
                    LinkRecord(a="b", b="c", state="up", bandwidth_mbps=1000.0)]
    policy = neg.publish_policy(effective_step=0)
    assert policy is not None and policy.chunk_kib == 64  # the tree crosses the 50 Mbit/s
    sched.links[0] = LinkRecord(a="a", b="b", state="up", bandwidth_mbps=None)
    policy = neg.publish_policy(effective_step=0)
    assert policy is not None and policy.chunk_kib == 0  # a link not measured yet: by size


def test_the_first_measurement_of_a_tree_published_unmeasured_gives_it_a_chunk_size() -> None:
    from daemon.contracts.protocol import LinkMetrics

    neg = _active("ab")
    sched = neg.sched
    sched.links.append(LinkRecord(a="a", b="b", state="up"))
    first = neg.publish_policy(effective_step=0)
    assert first is not None and first.chunk_kib == 0  # published before any measurement
    neg.metrics("a", LinkMetrics(peer="b", bandwidth_mbps=50.0))
    pub = sched.policy
    assert pub is not None and pub.version == first.version + 1 and pub.chunk_kib == 64
    assert pub.effective_step > 0  # a planned change, at a step boundary ahead
    neg.metrics("b", LinkMetrics(peer="a", bandwidth_mbps=60.0))  # later ones publish nothing
    assert sched.policy is pub


def test_a_measured_tree_much_wider_than_the_policys_replaces_it_and_noise_does_not() -> None:
    """The tree was published while a link was unmeasured, so it crossed the 11 Mbit/s link;
    once that link is measured at 39 Mbit/s the widest tree avoids it (3.5 times wider at its
    slowest link), as a planned change. Measurements that move a little change nothing."""
    from daemon.contracts.protocol import LinkMetrics

    neg = _active("abc")
    sched = neg.sched
    sched.links += [LinkRecord(a="a", b="b", state="up", bandwidth_mbps=11.0),
                    LinkRecord(a="a", b="c", state="up", bandwidth_mbps=43.0),
                    LinkRecord(a="b", b="c", state="up")]
    first = neg.publish_policy(effective_step=0)
    assert first is not None and ("a", "b") in first.edges
    neg.metrics("b", LinkMetrics(peer="c", bandwidth_mbps=39.0))
    pub = sched.policy
    assert pub is not None and pub.version == first.version + 1
    assert set(pub.edges) == {("a", "c"), ("b", "c")} and pub.effective_step > 0
    for node, peer, mbit in (("a", "b", 14.0), ("b", "c", 35.0), ("a", "c", 40.0)):
        neg.metrics(node, LinkMetrics(peer=peer, bandwidth_mbps=mbit))
        assert sched.policy is pub, (node, peer, mbit)


def test_a_tree_measured_much_faster_or_slower_than_its_chunks_gets_new_ones() -> None:
    """A fast link's first reading came from a probe too short to measure it (loopback read
    as a few hundred Mbit/s): its policy's 128 KiB chunks cost every later round. A reading
    that calls for chunks four times larger or smaller republishes; one that calls for twice
    does not."""
    from daemon.contracts.protocol import LinkMetrics

    neg = _active("ab")
    sched = neg.sched
    sched.links.append(LinkRecord(a="a", b="b", state="up", bandwidth_mbps=300.0))
    first = neg.publish_policy(effective_step=0)
    assert first is not None and first.chunk_kib == 128
    neg.metrics("a", LinkMetrics(peer="b", bandwidth_mbps=600.0))  # 256 KiB: within 4x
    assert sched.policy is first
    neg.metrics("a", LinkMetrics(peer="b", bandwidth_mbps=20_000.0))
    fast = sched.policy
    assert fast is not None and fast.version == first.version + 1 and fast.chunk_kib == 0
    assert fast.effective_step > 0  # a planned change, at a step boundary ahead
    neg.metrics("a", LinkMetrics(peer="b", bandwidth_mbps=1_500.0))  # 512 KiB: within 4x
    assert sched.policy is fast
    neg.metrics("a", LinkMetrics(peer="b", bandwidth_mbps=20.0))  # the link got slow
    slow = sched.policy
    assert slow is not None and slow.version == fast.version + 1 and slow.chunk_kib == 64
