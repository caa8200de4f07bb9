"""End-to-end all-reduce with 4 node processes on loopback."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from chaos_edge.dataplane import SyncPolicy, spanning_tree
from tests.dataplane._cluster import Cluster, expected_digest

pytestmark = pytest.mark.timeout(60)

IDS = ["n0", "n1", "n2", "n3"]
CHAIN = [("n0", "n1"), ("n1", "n2"), ("n2", "n3")]
STAR = [("n0", "n1"), ("n0", "n2"), ("n0", "n3")]
SAMPLES = {"n0": 1, "n1": 2, "n2": 3, "n3": 7}  # uneven on purpose
N = 300_007  # not a multiple of the chunk size


def _plan(
    policy: SyncPolicy, seed0: int, samples: dict[str, int]
) -> dict[str, tuple[str, int, int]]:
    return {n: (policy.to_json(), seed0 + i, samples[n]) for i, n in enumerate(policy.members)}


def _expect(plan: dict[str, tuple[str, int, int]]) -> str:
    return expected_digest([(seed, s) for _, seed, s in plan.values()], N)


@pytest.mark.parametrize("edges", [CHAIN, STAR], ids=["chain", "star"])
def test_consecutive_steps_are_exact_and_bit_identical(
    cluster: Callable[..., Cluster], edges: list[tuple[str, str]]
) -> None:
    c = cluster(IDS)
    c.connect(edges)
    tree = spanning_tree(IDS, {e: 100.0 for e in edges})
    policy = tree.policy(version=1)
    for step in range(3):
        plan = _plan(policy, 100 * step, SAMPLES)
        replies = c.run(plan, step, N)
        assert {r[0] for r in replies.values()} == {"ok"}, replies
        assert {r[1] for r in replies.values()} == {_expect(plan)}
        assert {r[2] for r in replies.values()} == {sum(SAMPLES.values())}


@pytest.mark.parametrize("victim", ["n3", "n2"], ids=["leaf", "cut-vertex"])
def test_peer_killed_mid_round_aborts_everyone_then_rerun_succeeds(
    cluster: Callable[..., Cluster], victim: str
) -> None:
    c = cluster(IDS)
    c.connect(CHAIN)
    policy = spanning_tree(IDS, dict.fromkeys(CHAIN, 100.0)).policy(version=1)
    assert policy.root in ("n1", "n2")
    first = c.run(_plan(policy, 0, SAMPLES), 0, N)
    assert {r[0] for r in first.values()} == {"ok"}

    c.call(victim, "kill_at", 1, 2)  # dies right after sending its third chunk of step 1
    replies = c.run(_plan(policy, 10, SAMPLES), 1, N, timeout=20.0)
    survivors = [n for n in IDS if n != victim]
    assert all(replies[n][0] == "aborted" for n in survivors), replies
    c.procs[victim].join(5.0)
    assert not c.procs[victim].is_alive()

    # The scheduler's view after the failure: the victim's links are gone.
    links = {e: 100.0 for e in CHAIN if victim not in e}
    tree = spanning_tree(survivors, links)
    assert tree.connected == (victim == "n3")
    plans: dict[str, tuple[str, int, int]] = {}
    for i, part in enumerate(tree.components):
        part_edges = [e for e in links if e[0] in part]
        sub = spanning_tree(part, dict.fromkeys(part_edges, 100.0)).policy(version=2)
        plans.update(_plan(sub, 10 + 10 * i, SAMPLES))
    rerun = c.run(plans, 1, N)
    for part_index, part in enumerate(tree.components):
        part_plan = {n: plans[n] for n in part}
        assert {rerun[n][1] for n in part} == {_expect(part_plan)}, part_index


def test_policy_version_mismatch_aborts_then_newer_version_succeeds(
    cluster: Callable[..., Cluster],
) -> None:
    c = cluster(IDS)
    c.connect(CHAIN)
    v1 = SyncPolicy.build(1, IDS, CHAIN, "n1")
    v2 = SyncPolicy.build(2, IDS, CHAIN, "n1")
    plan = _plan(v1, 0, SAMPLES)
    plan["n3"] = (v2.to_json(), plan["n3"][1], plan["n3"][2])
    replies = c.run(plan, 0, N, timeout=4.0)
    assert {r[0] for r in replies.values()} == {"aborted"}, replies
    assert "mismatch" in replies["n2"][1]

    v3 = SyncPolicy.build(3, IDS, CHAIN, "n1")
    plan = _plan(v3, 0, SAMPLES)
    replies = c.run(plan, 0, N)
    assert {r[1] for r in replies.values()} == {_expect(plan)}
