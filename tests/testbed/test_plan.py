"""The testbed's plan (pure functions: no root needed) and its state file."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from chaosctl.testbed import topo as topo
from chaosctl.testbed.state import STATE_FILE, LinkRecord, TestbedError, TestbedState

pytestmark = pytest.mark.timeout(30)


def connected(nodes: list[str], links: list[topo.Link]) -> bool:
    seen, todo = {nodes[0]}, [nodes[0]]
    while todo:
        for peer in topo.neighbours(links, todo.pop()):
            if peer not in seen:
                seen.add(peer)
                todo.append(peer)
    return seen == set(nodes)


@pytest.mark.parametrize(
    ("kind", "count", "expected"),
    [
        ("line", 4, [("n1", "n2"), ("n2", "n3"), ("n3", "n4")]),
        ("ring", 4, [("n1", "n2"), ("n1", "n4"), ("n2", "n3"), ("n3", "n4")]),
        ("ring", 2, [("n1", "n2")]),
        ("star", 4, [("n1", "n2"), ("n1", "n3"), ("n1", "n4")]),
        ("full", 3, [("n1", "n2"), ("n1", "n3"), ("n2", "n3")]),
        ("line", 1, []),
    ],
)
def test_fixed_topologies(kind: str, count: int, expected: list[topo.Link]) -> None:
    assert topo.topology(kind, count, random.Random(0)) == expected


@pytest.mark.parametrize("seed", range(20))
def test_random_topology_is_connected_and_follows_the_paper(seed: int) -> None:
    nodes = topo.node_names(12)
    links = topo.topology("random", 12, random.Random(seed), degree=2)
    assert connected(nodes, links)
    for i, node in enumerate(nodes):
        # Node i links to min(2, i) earlier nodes; later nodes add links to it.
        earlier = [p for p in topo.neighbours(links, node) if topo.node_index(p) < i + 1]
        assert len(earlier) == min(2, i)
    assert len(links) == 1 + 2 * 10


def test_plan_is_seeded() -> None:
    a = topo.Plan.make(10, "random", (100, 1000), seed=7)
    assert a == topo.Plan.make(10, "random", (100, 1000), seed=7)
    assert a != topo.Plan.make(10, "random", (100, 1000), seed=8)
    assert all(100 <= r <= 1000 for r in a.rates.values())
    assert set(a.rates) == set(a.links)


def test_addresses_and_devices() -> None:
    assert topo.data_addr("n3") == "10.10.0.3"
    assert topo.data_addr("n200") == "10.10.0.200"
    assert topo.mgmt_addr("n7") == "10.254.0.7"
    assert topo.link_dev("n12") == "e12"
    assert topo.norm("n10", "n9") == ("n9", "n10")
    with pytest.raises(topo.TopologyError):
        topo.node_index("x1")


@pytest.mark.parametrize(
    ("text", "expected"),
    [("100-1000", (100.0, 1000.0)), ("250", (250.0, 250.0)), (" 1.5 - 2 ", (1.5, 2.0))],
)
def test_parse_bw(text: str, expected: tuple[float, float]) -> None:
    assert topo.parse_bw(text) == expected


@pytest.mark.parametrize("text", ["", "fast", "10-5", "0-10", "-5", "1-2-3"])
def test_parse_bw_refuses(text: str) -> None:
    with pytest.raises(topo.TopologyError, match="--bw"):
        topo.parse_bw(text)


@pytest.mark.parametrize(("kind", "count"), [("mesh", 4), ("line", 0), ("line", 201)])
def test_bad_plans(kind: str, count: int) -> None:
    with pytest.raises(topo.TopologyError):
        topo.topology(kind, count, random.Random(0))


def test_state_round_trip(tmp_path: Path) -> None:
    st = TestbedState(prefix="chaos-ab-", dir=str(tmp_path), hub_ns="chaos-ab-hub",
                      broker="mqtt://10.254.0.254:1883", topology="line", seed=1, bw=(1.0, 2.0))
    st.links.append(LinkRecord("n1", "n2", "e2", "e1", 1.5))
    st.save()
    assert TestbedState.load(tmp_path) == st
    assert TestbedState.load(tmp_path / "nowhere") is None
    (tmp_path / STATE_FILE).write_text('{"version": 99}')
    with pytest.raises(TestbedError, match="not a testbed state"):
        TestbedState.load(tmp_path)
