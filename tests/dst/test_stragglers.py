"""Slow boxes and slow links in the simulator: the scheduler's straggler judge runs on the
real role, fed by what the simulated workers say of their compute and the probes of their
links.

A plan of four boxes slows n4 eight times from 12 s on. The judge sets it aside, measures the
gain, and lets it back for a trial. Killed between its set-aside and the step that takes
effect at, it is failed as a member and the others go on; with that fix undone (the mutant
``aside-unplanned``), the rounds until that step wait for it for good, and the referee sees
the stall (CI's testbed run, where three boxes never stepped again). A box whose links test
slow is set aside for its link and let back once newer tests of its links recover.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from chaos_bench.dst.broker import Net
from chaos_bench.dst.faults import SLOW_LINK_SEEDS, SLOW_SEEDS, Draws, Fault, Plan, make_plan
from chaos_bench.dst.run import Result, run_plan

pytestmark = pytest.mark.timeout(120)

SLOW = Plan(seed=5, duration=60.0, sites={f"n{i}": "s1" for i in range(1, 5)},
            initial=("n1", "n2", "n3", "n4"), net=Net(),
            faults=(Fault(12.0, "slow", "n4", 40.0),))
SLOW_LINK = replace(SLOW, faults=(Fault(12.0, "slow-link", "n4", 20.0),))
BEFORE = Draws(slow=False, slow_links=False)


def judged(res: Result) -> list[tuple[float, str]]:
    """(when, what) of each straggler event the run's trace shows."""
    return [(float(line.split()[0]), line.split("straggler ", 1)[1]) for line in res.trace
            if "straggler " in line]


def test_a_slow_box_is_set_aside_measured_and_let_back_for_a_trial() -> None:
    res = run_plan(SLOW, trace=True)
    assert res.ok, res.violations
    assert [what for _, what in judged(res)] == [
        "set-aside n4 (compute)", "measured n4 (compute)", "rejoin n4 (trial)"]
    (aside, _), _, (back, _) = judged(res)
    assert 12.0 < aside < back  # after it slowed, and 20 s on ([adaptive] straggler_retry_s)
    assert back - aside >= 20.0


def test_a_box_on_slow_links_is_set_aside_for_its_link_and_back_when_they_recover() -> None:
    res = run_plan(SLOW_LINK, trace=True)
    assert res.ok, res.violations
    events = judged(res)
    assert [what for _, what in events] == [
        "set-aside n4 (link)", "measured n4 (link)", "rejoin n4 (links-recovered)"]
    (aside, _), _, (back, _) = events
    # After its links fell, and back by their newer tests once they are fast (at 32 s),
    # before a trial would have let it back (20 s after its set-aside).
    assert 12.0 < aside < 32.0 < back < aside + 20.0


@pytest.mark.parametrize("fault", ["kill-worker", "crash"])
def test_a_straggler_gone_before_its_set_aside_takes_effect_stalls_no_one(fault: str) -> None:
    first = run_plan(SLOW, trace=True)
    at = judged(first)[0][0]
    # Gone at once, within the lead of steps its set-aside takes effect after; the run lasts
    # past the referee's stall bound (90 s) from there.
    plan = replace(SLOW, duration=at + 100.0,
                   faults=(*SLOW.faults, Fault(at + 0.05, fault, "n4", 5.0)))
    res = run_plan(plan, trace=True)
    assert res.ok, res.violations
    assert res.frontier > first.frontier  # the others trained on
    if fault == "kill-worker":  # its box is as slow: restarted, it waits for its trial
        assert [what for _, what in judged(res)][:3] == [
            "set-aside n4 (compute)", "measured n4 (compute)", "rejoin n4 (trial)"]
    broken = run_plan(plan, mutant="aside-unplanned")
    assert "stall" in {v.kind for v in broken.violations}, broken.violations


def test_slow_boxes_come_from_a_stream_of_their_own() -> None:
    """About SLOW_SEEDS of the plans slow a box, and only they run the judge; without the
    stream, each plan is the one drawn before it."""
    plans = [make_plan(seed, 60.0) for seed in range(400)]
    for kind, share in (("slow", SLOW_SEEDS), ("slow-link", SLOW_LINK_SEEDS)):
        drawn = sum(any(f.kind == kind for f in p.faults) for p in plans) / len(plans)
        assert abs(drawn - share) < 0.08
    for seed, plan in enumerate(plans[:50]):
        before = make_plan(seed, 60.0, draws=BEFORE)
        assert not before.judged
        assert [f for f in plan.faults if f.kind not in ("slow", "slow-link")] == list(
            before.faults)
        # Each stream alone: a plan drawn without slow links is the one stop 58 drew.
        assert [f for f in plan.faults if f.kind != "slow-link"] == list(
            make_plan(seed, 60.0, draws=Draws(slow_links=False)).faults)
