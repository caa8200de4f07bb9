"""The worker's scale-out state machines, transition by transition (no I/O, no threads)."""

from __future__ import annotations

import pytest

from chaos_edge.trainer.scaleout import (
    ASK_AGAIN_S,
    FETCH_RETRY_S,
    AskAgain,
    Fetch,
    GiveUp,
    Joined,
    JoinMachine,
    JoinPhase,
    ServeMachine,
    StartAlone,
    Wait,
    new_neighbours,
)
from daemon.contracts.policy import SyncPolicy
from daemon.contracts.protocol import Bootstrap, Replicate

pytestmark = pytest.mark.timeout(30)


def policy(version: int, members: tuple[str, ...], effective: int = 0) -> SyncPolicy:
    edges = tuple((members[0], m) for m in members[1:])
    return SyncPolicy.build(version, list(members), edges, members[0], effective,
                            {m: f"127.0.0.1:{7000 + i}" for i, m in enumerate(members)})


def rep(new: str = "c", version_step: int = 10, policy_version: int = 5,
        sources: tuple[str, ...] = ("a", "b")) -> Replicate:
    return Replicate(version_step=version_step, new=new, policy_version=policy_version,
                     sources={s: f"127.0.0.1:{7000 + i}" for i, s in enumerate(sources)})


def test_a_join_fetches_awaits_its_policy_then_is_a_member() -> None:
    m = JoinMachine("c", deadline=100.0)
    assert m.advance(0.0, None) == Wait() and m.phase is JoinPhase.WAITING
    cmd = rep()
    m.offer(cmd)
    assert m.advance(0.1, None) == Fetch(cmd) and m.phase is JoinPhase.FETCHING
    assert m.advance(0.2, None) == Wait()  # the pull is in flight
    m.fetched(True, 0.3)
    assert m.phase is JoinPhase.AWAITING_POLICY
    assert m.advance(0.4, policy(4, ("a", "b"))) == Wait()  # the command outran its policy
    assert m.advance(0.5, policy(5, ("a", "b", "c"))) == Joined()
    assert m.phase is JoinPhase.MEMBER


def test_a_failed_pull_is_retried_with_the_newest_command() -> None:
    m = JoinMachine("c", deadline=100.0)
    first, second = rep(version_step=10), rep(version_step=12, sources=("b",))
    m.offer(first)
    assert m.advance(0.0, None) == Fetch(first)
    m.offer(second)
    assert m.superseded  # the pull in flight is moot: the owner abandons it
    m.fetched(False, 1.0)
    assert m.phase is JoinPhase.RETRYING
    assert m.advance(1.0 + FETCH_RETRY_S / 2, None) == Wait()
    assert m.advance(1.0 + FETCH_RETRY_S, None) == Fetch(second) and m.fetches == 2
    m.fetched(False, 2.0)  # failed again, no newer command: the same one once more
    assert m.advance(2.0 + FETCH_RETRY_S, None) == Fetch(second)


def test_pulls_failing_for_a_while_ask_the_join_again_then_go_on() -> None:
    """A source cut off from the broker when the command went out never learnt of the join
    and refuses it: pulls failing for ASK_AGAIN_S ask to join again (the scheduler resends
    the command to every source), once per ASK_AGAIN_S, and the pulls go on."""
    m = JoinMachine("c", deadline=100.0)
    cmd = rep()
    m.offer(cmd)
    t = 0.0
    asked = []
    assert m.advance(t, None) == Fetch(cmd)
    while t < 3 * ASK_AGAIN_S:
        m.fetched(False, t)
        t += FETCH_RETRY_S
        action = m.advance(t, None)
        if action == AskAgain():
            asked.append(t)
            action = m.advance(t, None)
        assert action == Fetch(cmd)
    assert asked == [ASK_AGAIN_S, 2 * ASK_AGAIN_S, 3 * ASK_AGAIN_S]
    m.offer(cmd)  # the same command, sent again: the pull in flight goes on
    assert not m.superseded
    m.fetched(True, t)  # in at last: no more asking
    assert m.advance(t + ASK_AGAIN_S, policy(5, ("a", "b", "c"))) == Joined()


def test_bootstrap_starts_alone_and_waits_for_its_policy() -> None:
    m = JoinMachine("a", deadline=100.0)
    boot = Bootstrap(new="a", policy_version=1)
    m.offer(boot)
    assert m.advance(0.0, None) == StartAlone(boot)
    assert m.advance(0.1, None) == Wait()
    assert m.advance(0.2, policy(1, ("a",))) == Joined()


def test_a_bootstrap_waits_while_chaosd_is_out_of_touch() -> None:
    """Thawed from a freeze, the worker's book is as old as its freeze: it acts on a
    bootstrap only once chaosd hears the cluster again (the simulator's seed 2167)."""
    m = JoinMachine("a", deadline=100.0)
    boot = Bootstrap(new="a", policy_version=3)
    m.offer(boot)
    assert m.advance(0.0, None, in_touch=False) == Wait()
    assert m.phase is JoinPhase.WAITING
    assert m.advance(0.1, policy(3, ("a",)), in_touch=True) == StartAlone(boot)


def test_a_bootstrap_a_newer_policy_leaves_us_out_of_is_dropped() -> None:
    """The scheduler made another node the start since (v4 without us): starting alone now
    would fork the cluster from our older state. The command is dropped; the machine waits
    for the one chaosd asks for again, and carries that out."""
    m = JoinMachine("a", deadline=100.0)
    stale = Bootstrap(new="a", policy_version=3)
    m.offer(stale)
    assert m.advance(0.0, policy(4, ("b",))) == Wait()
    assert m.phase is JoinPhase.WAITING and m.command is None
    assert m.advance(0.1, policy(4, ("b",))) == Wait()  # not carried out later either
    fresh = rep(new="a", policy_version=5, sources=("b",))
    m.offer(fresh)
    assert m.advance(0.2, policy(4, ("b",))) == Fetch(fresh)


def test_a_bootstrap_of_an_ended_term_is_dropped() -> None:
    """The simulator's seed 2759: a term-6 bootstrap, held while chaosd was out of touch, was
    carried out after a term-7 scheduler had planned our join from a holder of a newer
    step; the worker's book was still a term-5 policy, so no policy showed it stale. The
    term chaosd knows (its poll says it) does."""
    m = JoinMachine("a", deadline=100.0)
    boot = Bootstrap(new="a", policy_version=5_000_001)  # term 6
    m.offer(boot)
    assert m.advance(0.0, policy(4_000_002, ("b",)), term=7) == Wait()
    assert m.phase is JoinPhase.WAITING and m.command is None
    m2 = JoinMachine("a", deadline=100.0)
    m2.offer(boot)
    assert m2.advance(0.0, policy(4_000_002, ("b",)), term=6) == StartAlone(boot)  # its own term


def test_a_bootstrap_whose_policy_has_not_come_yet_is_not_stale() -> None:
    m = JoinMachine("a", deadline=100.0)
    boot = Bootstrap(new="a", policy_version=3)
    m.offer(boot)
    assert m.advance(0.0, policy(2, ("b",))) == StartAlone(boot)  # v3 is on its way


def test_commands_for_other_nodes_are_not_ours() -> None:
    m = JoinMachine("c", deadline=100.0)
    m.offer(rep(new="d"))
    assert m.advance(0.0, None) == Wait()


@pytest.mark.parametrize(("phase_cmd", "words"), [
    (None, "no replicate command arrived"),
    ("fetching", "could not pull the state"),
    ("awaiting", "never arrived"),
])
def test_the_deadline_ends_a_join_with_a_reason(phase_cmd: str | None, words: str) -> None:
    m = JoinMachine("c", deadline=10.0)
    if phase_cmd:
        m.offer(rep())
        m.advance(0.0, None)
        if phase_cmd == "awaiting":
            m.fetched(True, 1.0)
    action = m.advance(10.5, None)
    assert isinstance(action, GiveUp) and words in action.reason
    assert m.phase is JoinPhase.TIMED_OUT
    m.offer(rep())  # terminal: nothing more happens
    assert isinstance(m.advance(11.0, None), GiveUp)


def test_a_refused_state_ends_the_join() -> None:
    m = JoinMachine("c", deadline=10.0)
    m.offer(rep())
    m.advance(0.0, None)
    m.refused()
    assert m.phase is JoinPhase.REFUSED and isinstance(m.advance(0.1, None), GiveUp)


def test_a_source_serves_once_it_committed_the_step_and_the_new_policy_governs() -> None:
    s = ServeMachine("a")
    cmd = rep(version_step=10, policy_version=5)
    s.offer(cmd)
    s.offer(rep(new="d", sources=("b",)))  # not ours to serve
    assert s.knows("c") and not s.knows("d")
    old, new = policy(4, ("a", "b")), policy(5, ("a", "b", "c"), effective=11)
    assert s.due(9, new) == []  # step 10 not committed yet
    assert s.due(10, old) == []  # the command outran its policy
    assert s.due(10, None) == []
    assert s.due(10, new) == [cmd] and not s.knows("c")
    assert s.due(11, new) == []  # served once


def test_a_late_command_is_served_from_where_the_source_is() -> None:
    s = ServeMachine("a")
    cmd = rep(version_step=10)
    s.offer(cmd)
    assert s.due(14, policy(5, ("a", "b", "c"))) == [cmd]


def test_a_newer_command_replaces_an_older_and_forget_drops_it() -> None:
    s = ServeMachine("a")
    s.offer(rep(version_step=10))
    newer = rep(version_step=12, policy_version=6)
    s.offer(newer)
    assert list(s.waiting.values()) == [newer]
    s.forget("c")
    assert not s.waiting


def test_a_newer_command_that_does_not_name_us_ends_the_wait_to_serve() -> None:
    s = ServeMachine("a")
    s.offer(rep(new="c", sources=("a", "b")))
    s.offer(rep(new="c", sources=("b",)))  # another plan for c: b serves it alone
    assert not s.knows("c")
    s.offer(rep(new="d"))
    s.offer(Bootstrap(new="d", policy_version=7))  # d starts alone: nobody serves it
    assert not s.knows("d")


def test_due_commands_come_in_arrival_order() -> None:
    s = ServeMachine("a")
    c, d = rep(new="c"), rep(new="d")
    s.offer(c)
    s.offer(d)
    c2 = rep(new="c", version_step=11)
    s.offer(c2)  # c's newer command arrived after d's
    assert s.due(12, policy(5, ("a", "b", "c", "d"))) == [d, c2]


def test_a_command_that_names_no_policy_waits_for_a_policy_naming_us() -> None:
    m = JoinMachine("c", deadline=100.0)
    m.offer(rep(policy_version=-1))
    m.advance(0.0, None)
    m.fetched(True, 0.1)
    assert m.advance(0.2, policy(9, ("a", "b"))) == Wait()
    assert m.advance(0.3, policy(9, ("a", "b", "c"))) == Joined()


def test_a_command_that_came_after_the_pull_is_left_for_the_next_join() -> None:
    m = JoinMachine("c", deadline=100.0)
    first, resent = rep(), rep(version_step=12)
    m.offer(first)
    m.advance(0.0, None)
    assert m.unused is None
    m.fetched(True, 0.1)
    m.offer(resent)  # while the policy is awaited
    assert m.advance(0.2, policy(5, ("a", "b", "c"))) == Joined() and m.unused == resent


def test_a_command_of_another_plan_while_the_policy_is_awaited_is_carried_out() -> None:
    """A new scheduler planned our join anew while we awaited the old plan's policy: its
    policy names us from its own step, so joining on it with the old plan's state trained on
    an older state than a member held (the simulator's seed 397). The new plan is pulled."""
    m = JoinMachine("c", deadline=100.0)
    old, new = rep(version_step=363, policy_version=50), rep(version_step=386,
                                                            policy_version=1000001)
    m.offer(old)
    m.advance(0.0, None)
    m.fetched(True, 0.1)
    m.offer(new)
    assert m.advance(0.2, policy(1000001, ("a", "b", "c"), effective=387)) == Fetch(new)
    assert m.phase is JoinPhase.FETCHING and m.unused is None
    m.fetched(True, 0.3)
    assert m.advance(0.4, policy(1000001, ("a", "b", "c"), effective=387)) == Joined()
    # A bootstrap would start from the state we hold anyway: kept for the next join.
    m = JoinMachine("c", deadline=100.0)
    m.offer(old)
    m.advance(0.0, None)
    m.fetched(True, 0.1)
    boot = Bootstrap(new="c", policy_version=60)
    m.offer(boot)
    assert m.advance(0.2, policy(60, ("c",))) == Joined() and m.unused == boot


def test_new_neighbours_are_tree_neighbours_that_were_no_members() -> None:
    prev, pub = policy(4, ("a", "b")), policy(5, ("a", "b", "c"))
    assert new_neighbours("a", pub, prev) == ["c"]
    assert new_neighbours("a", pub, pub) == []
    assert new_neighbours("c", pub, prev) == []  # we are new ourselves
