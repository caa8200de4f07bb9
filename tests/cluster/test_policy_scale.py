"""The scheduler's policy step at thousands of members (issue 12): the same tree and root as
rooting the tree at every node in turn, the O(N^2) way it was chosen before.

No wall-clock assertions: the step's cost is measured by ``chaosctl bench simulate``
(BENCHMARKS.md, "The scheduler's policy step"); these tests pin down its result.
"""

from __future__ import annotations

import random
from collections import deque

import pytest

from daemon.cluster.primitives import Negotiator
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.messages import LinkRecord
from daemon.contracts.policy import Edge, SyncPolicy, spanning_tree

pytestmark = pytest.mark.timeout(120)


def _depths(root: str, edges: tuple[Edge, ...]) -> dict[str, int]:
    adj: dict[str, list[str]] = {}
    for a, b in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    depth = {root: 0}
    queue = deque([root])
    while queue:
        n = queue.popleft()
        for m in adj.get(n, ()):
            if m not in depth:
                depth[m] = depth[n] + 1
                queue.append(m)
    return depth


def brute_centre(nodes: frozenset[str], edges: tuple[Edge, ...]) -> str:
    """The rule of docs/training-protocol.md the slow way: every node as the root in turn,
    the least depth, then the least total depth, then the least id."""
    def key(n: str) -> tuple[int, int, str]:
        d = _depths(n, edges)
        return max(d.values()), sum(d.values()), n

    return min(nodes, key=key)


def random_graph(n: int, rng: random.Random, extra: int) -> dict[Edge, float]:
    """A random tree plus ``extra`` random links; few distinct bandwidths, so many ties."""
    links: dict[Edge, float] = {}
    for i in range(1, n):
        links[(f"n{rng.randrange(i)}", f"n{i}")] = float(rng.choice((10, 100, 1000)))
    for _ in range(extra):
        a, b = rng.randrange(n), rng.randrange(n)
        links[(f"n{a}", f"n{b}")] = float(rng.choice((10, 100, 1000)))
    return links


@pytest.mark.parametrize("seed", range(40))
def test_centre_is_the_brute_force_one(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.choice((1, 2, 3, 5, 8, 30, 120))
    members = [f"n{i}" for i in range(n)]
    # Sometimes a path (two centres, ties), sometimes a star, sometimes a random graph.
    shape = seed % 3
    if shape == 0:
        links = {(f"n{i}", f"n{i + 1}"): 100.0 for i in range(n - 1)}
    elif shape == 1:
        links = {("n0", f"n{i}"): 100.0 for i in range(1, n)}
    else:
        links = random_graph(n, rng, extra=n // 2)
    plan = spanning_tree(members, links)
    assert plan.root == brute_centre(plan.components[0], plan.edges)


def test_centre_with_a_partition() -> None:
    rng = random.Random(7)
    links = random_graph(60, rng, extra=20)
    links = {e: v for e, v in links.items() if "n59" not in e}  # n59 is cut off
    plan = spanning_tree([f"n{i}" for i in range(60)], links)
    assert not plan.connected and plan.components[1] == frozenset({"n59"})
    assert plan.root == brute_centre(plan.components[0], plan.edges)


def big_cluster(n: int, seed: int = 1) -> Negotiator:
    """The real scheduler with ``n`` active members, each linked to three earlier ones."""
    rng = random.Random(seed)
    clock = FakeClock()
    sched = Scheduler("n1", 1, None, clock)
    for i in range(1, n + 1):
        sched.set_node(f"n{i}", state="active", addr=f"10.1.{i // 256}.{i % 256}",
                       data_addr=f"10.1.{i // 256}.{i % 256}:7000", incarnation=1)
    seen: set[tuple[str, str]] = set()
    for i in range(2, n + 1):
        for j in rng.sample(range(1, i), min(3, i - 1)):
            a, b = sorted((f"n{j}", f"n{i}"))
            if (a, b) not in seen:
                seen.add((a, b))
                sched.links.append(LinkRecord(a=a, b=b, state="up",
                                              bandwidth_mbps=float(rng.randint(100, 1000))))
    return Negotiator(sched, clock, lambda _node: 0)


def test_policy_step_at_5000_members_is_a_spanning_tree_rooted_at_a_centre() -> None:
    neg = big_cluster(5000)
    policy = neg.publish_policy(effective_step=0)
    assert policy is not None
    members = set(policy.members)
    assert members == {f"n{i}" for i in range(1, 5001)}
    assert len(policy.edges) == len(members) - 1
    assert set(_depths(policy.root, policy.edges)) == members  # connected: a spanning tree
    # A centre: its depth is the tree's radius, half its diameter (two BFS passes).
    far = max(_depths(policy.root, policy.edges).items(), key=lambda kv: kv[1])[0]
    diameter = max(_depths(far, policy.edges).values())
    assert max(_depths(policy.root, policy.edges).values()) == (diameter + 1) // 2
    # Every link is an up link of the snapshot, and the neighbours follow the links.
    ups = {(lk.a, lk.b) for lk in neg.sched.links}
    assert set(policy.edges) <= ups
    assert all(len(neg.sched.nodes[m].neighbors) >= 1 for m in members)
    # What a worker derives from it is the same after the trip through the snapshot.
    again = SyncPolicy.from_dict(policy.to_dict())
    assert again == policy
    assert again.parent(policy.root) is None and again.children(policy.root)


def test_policy_step_is_the_brute_force_one_at_300_members() -> None:
    neg = big_cluster(300, seed=3)
    policy = neg.publish_policy(effective_step=0)
    assert policy is not None
    assert policy.root == brute_centre(frozenset(policy.members), policy.edges)
