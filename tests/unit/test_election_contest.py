"""After a partition heals, the larger training part keeps its scheduler (fake clock).

Two schedulers meet when a cut between sites heals. The better claim (the newer term) used to
win whatever its size. Now a scheduler that hears a better claim while more nodes train under
its own policies than the rival's claim names contests it for ``contest_s``; if it still
outnumbers the rival then, it claims a term above the rival's. Its followers hold on to it
while it is alive, for two contest windows, so they do not leave it mid-contest. Counts are
what each scheduler heard itself (docs/multi-broker.md); a tie keeps the better claim.
"""

from __future__ import annotations

import pytest

from daemon.cluster.election import Action, Election, Heard, stronger
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import ElectionConfig

pytestmark = pytest.mark.timeout(30)
CFG = ElectionConfig(stagger_s=0.3, grace_s=1.5, contest_s=1.0)


def leading(me: str, term: int, clock: FakeClock) -> Election:
    el = Election(me, CFG, clock)
    el.connected()
    el.restore(term - 1)
    clock.advance(CFG.grace_s)
    assert el.tick(set()).action is Action.CLAIM and el.term == term
    return el


def following(me: str, leader: str, term: int, clock: FakeClock) -> Election:
    el = Election(me, CFG, clock)
    el.connected()
    assert el.on_claim(leader, term).action is Action.FOLLOW
    return el


def test_the_larger_part_outbids_the_newer_term() -> None:
    clock = FakeClock()
    s = leading("s", 1, clock)  # held the scheduler; 3 nodes train under it
    r = leading("r", 2, clock)  # the cut-off site's new scheduler; 1 node trains under it
    # The heal: s hears r's better claim, but outnumbers it: it restates its own claim with
    # its count (r answers with a fresh one), and waits for the count.
    assert s.on_claim("r", 2, training=1, own=3).action is Action.CLAIM
    assert s.is_leader and s.term == 1
    clock.advance(0.5)
    assert s.tick({"r"}, own=3).action is Action.NONE  # the window is still open
    # r re-asserts (it heard s's worse claim) with a fresh count: still smaller.
    assert s.on_claim("r", 2, training=1, own=3).action is Action.NONE
    clock.advance(0.6)
    verdict = s.tick({"r"}, own=3)
    assert verdict.action is Action.CLAIM and verdict.term == 3 and s.is_leader
    # r hears the higher term, with more nodes behind it: it steps down at once.
    assert r.on_claim("s", 3, training=3, own=1).action is Action.STEP_DOWN
    assert r.leader == "s" and r.term == 3


def test_the_smaller_part_steps_down_at_once() -> None:
    clock = FakeClock()
    s = leading("s", 1, clock)
    assert s.on_claim("r", 2, training=3, own=1).action is Action.STEP_DOWN
    assert s.leader == "r" and s.term == 2


def test_a_fresher_count_from_the_rival_ends_the_contest_in_its_favour() -> None:
    clock = FakeClock()
    s = leading("s", 1, clock)
    # The retained claim was published when r's part was small; its re-assertion is not.
    assert s.on_claim("r", 2, training=0, own=2).action is Action.CLAIM
    assert s.on_claim("r", 2, training=4, own=2).action is Action.STEP_DOWN
    assert s.leader == "r" and s.term == 2
    clock.advance(1.1)
    assert s.tick({"r"}, own=2).action is Action.NONE  # the contest is over


def test_our_part_shrinking_during_the_contest_yields_at_its_end() -> None:
    clock = FakeClock()
    s = leading("s", 1, clock)
    assert s.on_claim("r", 2, training=2, own=3).action is Action.CLAIM
    clock.advance(1.1)
    verdict = s.tick({"r"}, own=2)  # one of ours went quiet meanwhile: a tie
    assert verdict.action is Action.STEP_DOWN and s.leader == "r" and s.term == 2


def test_a_tie_keeps_the_better_claim() -> None:
    clock = FakeClock()
    s = leading("s", 1, clock)
    assert s.on_claim("r", 2, training=2, own=2).action is Action.STEP_DOWN


def test_a_thawed_scheduler_with_no_one_behind_it_steps_down() -> None:
    """A SIGSTOPped scheduler thaws believing it leads: nobody trains under its policies any
    more (their heartbeats name the new term's), so it has nothing to contest with."""
    clock = FakeClock()
    old = leading("a", 1, clock)
    assert old.on_claim("b", 2, training=-1, own=0).action is Action.STEP_DOWN


def test_followers_hold_on_to_a_live_leader_while_it_contests() -> None:
    clock = FakeClock()
    f = following("f", "s", 1, clock)
    clock.advance(CFG.grace_s)
    assert f.tick({"s", "r"}).action is Action.NONE  # s is alive
    assert f.on_claim("r", 2).action is Action.NONE  # deferred, not followed
    assert f.leader == "s" and f.deferring
    clock.advance(1.0)
    assert f.tick({"s", "r"}).action is Action.NONE
    # s won its contest: its new term is better than the deferred claim, which is dropped.
    assert f.on_claim("s", 3).action is Action.FOLLOW
    assert f.leader == "s" and f.term == 3 and not f.deferring
    clock.advance(5.0)
    assert f.tick({"s", "r"}).action is Action.NONE and f.leader == "s"


def test_followers_switch_once_the_window_passes_or_their_leader_dies() -> None:
    clock = FakeClock()
    f = following("f", "s", 1, clock)
    clock.advance(CFG.grace_s)
    f.tick({"s", "r"})
    assert f.on_claim("r", 2).action is Action.NONE
    clock.advance(2 * CFG.contest_s)
    assert f.tick({"s", "r"}).action is Action.FOLLOW and f.leader == "r" and f.term == 2
    g = following("g", "s", 1, clock)
    g.tick({"s", "r"})
    assert g.on_claim("r", 2).action is Action.NONE
    assert g.tick({"r"}).action is Action.FOLLOW and g.leader == "r"  # s is gone: at once


def test_a_follower_of_a_dead_leader_follows_a_better_claim_at_once() -> None:
    """Failover is not slowed: only a live leader is held on to."""
    clock = FakeClock()
    f = following("f", "s", 1, clock)
    f.tick({"r"})  # s is not alive (and within grace, f does not stand itself)
    assert f.on_claim("r", 2).action is Action.FOLLOW and f.leader == "r"


def test_contest_s_zero_keeps_the_old_rule() -> None:
    clock = FakeClock()
    cfg = ElectionConfig(stagger_s=0.3, grace_s=1.5, contest_s=0.0)
    s = Election("s", cfg, clock)
    s.connected()
    clock.advance(cfg.grace_s)
    assert s.tick(set()).action is Action.CLAIM
    assert s.on_claim("r", 2, training=1, own=5).action is Action.STEP_DOWN


def test_the_part_holding_the_newer_state_keeps_the_cluster() -> None:
    """The simulator's seeds 478 and 1260: a count of trainees decided for a stale scheduler
    back from a cut, or for one whose trainees were stuck joining, over the part that had
    trained on. Claims carry the newest step their trainees committed; the newer state wins,
    and the count decides between equals."""
    assert not stronger(own=3, own_step=54, training=1, step=173)
    assert stronger(own=1, own_step=173, training=3, step=54)
    assert stronger(own=3, own_step=100, training=1, step=100)  # equal: the count
    assert stronger(own=2, own_step=-1, training=1, step=80)  # not said: the count


def test_a_node_obeys_one_scheduler_per_term() -> None:
    """The simulator's seed 1958: three nodes elected themselves for term 2 behind a cut; at
    the heal the ties were won by bumping the term, but two winners bumped to 3 at once and
    nodes obeyed both in term 3. A node that acted on one scheduler's command in a term acts
    on nobody else's in it; the tie's winner leads the next term."""
    el = Election("c", ElectionConfig(), FakeClock())
    el.on_claim("b", 3)
    assert el.admits(3, "b")
    el.obeyed(3, "b")
    el.on_claim("a", 3)  # a better claim of the same term: followed...
    assert el.leader == "a"
    assert not el.admits(3, "a")  # ...but not obeyed in the term we obeyed b in
    el.on_claim("a", 4)
    assert el.admits(4, "a")


def test_the_rival_with_the_newer_term_trains_no_round_while_it_may_be_contested() -> None:
    """The simulator's seed 16629: the scheduler back from a cut contested the newer term on
    the step it last heard, won on a tie of steps, and redid rounds the rival's side had
    committed meanwhile. Hearing a worse claim from another scheduler, a node holds its rounds
    for two contest windows (``challenged``), so the state the contest weighs stays put."""
    clock = FakeClock()
    r = leading("r", 2, clock)
    f = following("f", "r", 2, clock)
    assert not r.challenged and not f.challenged
    assert r.on_claim("s", 1, training=3).action is Action.CLAIM  # re-asserts, and holds
    f.on_claim("s", 1, training=3)
    assert r.challenged and f.challenged
    clock.advance(2 * CFG.contest_s + 0.01)
    assert not r.challenged and not f.challenged
    r.on_claim("r", r.term)  # a claim of our own leader's or our own never challenges
    assert not r.challenged


def test_the_rival_is_weighed_by_what_we_hear_of_its_part_not_only_by_its_claim() -> None:
    """The simulator's seed 1127: a scheduler frozen through a cut came back after a broker
    restart and reclaimed its old term, while the newer term's members had trained on. The
    newer term's scheduler, itself back a moment before, claimed with no follower heard yet
    (step 0); weighed on that word, the stale scheduler's own worker (step 3) looked the newer
    state, and it outbid the newer term. It heard those followers hold step 7 itself."""
    clock = FakeClock()
    s = leading("s", 1, clock)
    lagging = {"training": 0, "step": 0, "own": 1, "own_step": 3}
    assert s.on_claim("r", 2, **lagging, heard=Heard(training=0, step=7)).action \
        is Action.STEP_DOWN
    assert (s.term, s.leader) == (2, "r")
    # Weighed on the claim alone (nothing heard outside our part), it would have contested.
    t = leading("t", 1, clock)
    assert t.on_claim("r", 2, **lagging, heard=Heard()).action is Action.CLAIM
    # Followers of the rival that we hear count too, whatever its claim says.
    u = leading("u", 1, clock)
    assert u.on_claim("r", 2, training=0, own=2, heard=Heard(training=3)).action \
        is Action.STEP_DOWN


def test_a_contest_is_won_only_on_what_was_heard() -> None:
    """Seed 1127 in full: the contest opened as the scheduler came back, a broker restart
    took its window, and it decided at once on reconnecting, with nobody heard: its own
    worker against a claim that named none. A contest settles in our favour only if every
    live peer was heard lately, and what they hold is weighed; else the newer term wins."""
    clock = FakeClock()
    for everyone, won in ((False, False), (True, True)):
        s = leading("s", 1, clock)
        assert s.on_claim("r", 2, training=0, own=1, own_step=149).action is Action.CLAIM
        clock.advance(CFG.contest_s + 0.1)
        verdict = s.tick({"r", "p"}, own=1, own_step=149, heard=Heard(everyone=everyone))
        assert (verdict.action is Action.CLAIM) is won and s.is_leader is won
        assert s.term == (3 if won else 2)
    # Heard, a state newer than ours outside our part yields too, at the decision.
    s = leading("s", 1, clock)
    assert s.on_claim("r", 2, training=0, own=1, own_step=149).action is Action.CLAIM
    clock.advance(CFG.contest_s + 0.1)
    verdict = s.tick({"r", "p"}, own=1, own_step=149, heard=Heard(step=151))
    assert verdict.action is Action.STEP_DOWN and (s.term, s.leader) == (2, "r")
