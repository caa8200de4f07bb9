"""Who hears whom, on the fake fabric: subscriptions follow the role, followers rank an
election's candidates without hearing each other, and a follower's view of the nodes it does
not hear comes from the scheduler's snapshot.

The fabric hands every message to every agent (as if everyone subscribed to everything): what
a follower must not use, it must drop itself, which these tests check too.
"""

from __future__ import annotations

import pytest

from daemon.agent import views
from tests.agent.test_node import Fabric, T

pytestmark = pytest.mark.timeout(20)
HB_ALL = f"{T.root}/node/+/hb"


def hb_topics(fab: Fabric, node: str) -> set[str]:
    """The heartbeats ``node`` hears, but for its own (every node hears itself come back)."""
    subs = fab.agents[node].bus.subscriptions
    assert T.hb(node) in subs
    return {t for t in subs if t.endswith("/hb") and t != T.hb(node)}


async def test_subscriptions_follow_the_role() -> None:
    fab = Fabric()
    await fab.add("a", "b", "c")
    await fab.run(2.5)
    assert fab.agents["a"].role is not None
    assert hb_topics(fab, "a") == {HB_ALL} and T.req in fab.agents["a"].bus.subscriptions
    for node in "bc":
        subs = fab.agents[node].bus.subscriptions
        assert hb_topics(fab, node) == {T.hb("a")} and T.req not in subs
        assert {T.cmd(node), T.leader, T.state, f"{T.root}/node/+/status"} <= subs
        # Other followers' heartbeats reach it here, and are dropped: it judges only "a".
        assert fab.agents[node].detector.known() == ["a"]
    # "a" freezes: "b" takes over; "a" thaws, steps down, and hears only "b".
    fab.frozen.add("a")
    await fab.run(4.0)
    assert fab.agents["b"].role is not None and hb_topics(fab, "b") == {HB_ALL}
    fab.frozen.discard("a")
    # What the thawed node reads first: the claim retained while it was frozen.
    fab.bus("a").deliver(T.leader, fab.bus("b").published(T.leader)[-1][0].payload)
    await fab.run(1.0)
    assert fab.agents["a"].role is None
    assert hb_topics(fab, "a") == {T.hb("b")} and T.req not in fab.agents["a"].bus.subscriptions
    assert hb_topics(fab, "c") == {T.hb("b")}


@pytest.mark.parametrize("victim", ["frozen", "gone"])
async def test_the_lowest_live_id_succeeds_a_dead_scheduler(victim: str) -> None:
    fab = Fabric()
    await fab.add("a", "b", "c", "d")
    await fab.run(2.5)
    # "b" is dead too, and only the scheduler knew it (its snapshot says failed).
    fab.frozen.add("b")
    await fab.run(4.0)
    assert fab.agents["a"].view is not None
    assert fab.agents["a"].view.nodes["b"].state == "failed"
    term = fab.agents["c"].election.term
    if victim == "frozen":
        fab.frozen.add("a")
    else:  # its last will: the status every follower holds goes offline
        fab.frozen.add("a")
        lost = fab.agents["a"]._status(False, "lost")
        for node in "cd":
            fab.bus(node).deliver(T.status("a"), lost)
    await fab.run(4.0)
    # Neither "a" (dead to its watchers) nor "b" (failed in the snapshot) is ranked: "c"
    # stands first and alone, "d" follows it.
    assert [n for n in "cd" if fab.agents[n].role is not None] == ["c"]
    assert {(fab.agents[n].election.term, fab.agents[n].election.leader) for n in "cd"} == {
        (term + 1, "c")}
    assert fab.agents["c"].scheduler is not None
    elected = [e for e in fab.agents["c"].scheduler.events
               if e.kind == "scheduler-elected" and e.term > term]
    assert [e.node for e in elected] == ["c"]


async def test_a_follower_shows_what_the_scheduler_heard() -> None:
    fab = Fabric()
    await fab.add("a", "b", "c")
    await fab.run(8.0)  # past a periodic republish, with heartbeats heard
    rows = {r["id"]: r for r in views.nodes(fab.agents["b"], {})}
    assert set(rows) == {"a", "b", "c"}
    assert rows["a"]["scheduler"] and rows["a"]["heartbeat_age_s"] is not None
    # "b" does not hear "c": the age is the scheduler's, as of its last snapshot (<= 5 s).
    assert fab.agents["b"].detector.age("c") is None
    age = rows["c"]["heartbeat_age_s"]
    assert age is not None and 0.0 <= age <= 5.6
