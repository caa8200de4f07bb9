"""The deterministic simulator itself: its broker, its replay, and a quiet run.

What the harness finds in the protocol is tests/dst/test_seeds.py's; here it is checked that
the harness can be trusted: a run is a function of its seed, a leak of real time or of an
unseeded random is caught, and a cluster left alone trains without breaking anything.
"""

from __future__ import annotations

import random
from collections.abc import Generator

import pytest

from chaos_bench.dst.broker import Net, matches
from chaos_bench.dst.faults import FAST_PACE_S, SLOW_PACE_S, Fault, Plan, make_plan
from chaos_bench.dst.loop import HarnessError, drive
from chaos_bench.dst.plane import DataPlane
from chaos_bench.dst.run import replay, run_plan, run_seed

pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize(
    ("pattern", "topic", "hit"),
    [
        ("chaos/c/node/+/hb", "chaos/c/node/n1/hb", True),
        ("chaos/c/node/+/hb", "chaos/c/node/n1/status", False),
        ("chaos/c/#", "chaos/c/sched/leader", True),
        ("chaos/c/sched/leader", "chaos/c/sched/leader", True),
        ("chaos/c/sched/leader", "chaos/c/sched", False),
        ("chaos/c/node/n1/cmd", "chaos/c/node/n2/cmd", False),
    ],
)
def test_topic_filters_match_as_mqtt_says(pattern: str, topic: str, hit: bool) -> None:
    assert matches(pattern, topic) is hit


def test_a_cluster_left_alone_trains_and_breaks_nothing() -> None:
    plan = Plan(
        seed=5,
        duration=40.0,
        sites={f"n{i}": "s1" for i in range(1, 5)},
        initial=("n1", "n2", "n3", "n4"),
        net=Net(),
    )
    res = run_plan(plan)
    assert res.ok, res.violations
    assert res.coverage["join:member"] == 4 and res.coverage["bootstrap"] == 1
    assert res.frontier > 50  # it trains


def test_a_quarter_of_the_seeds_step_four_times_as_fast() -> None:
    # Soak fault 22 needs a lead longer than the minimum, i.e. a cluster that steps fast
    # (the lead is half a second of steps): the same quiet cluster with a join steps about
    # four times as often at the fast pace, and keeps every invariant.
    def frontier(pace: float) -> int:
        plan = Plan(seed=5, duration=30.0, sites={f"n{i}": "s1" for i in range(1, 5)},
                    initial=("n1", "n2", "n3"), net=Net(),
                    faults=(Fault(20.0, "join", "n4"),), pace=pace)
        res = run_plan(plan)
        assert res.ok, res.violations
        assert res.coverage["join:member"] == 4
        return res.frontier

    assert frontier(FAST_PACE_S) > 3 * frontier(SLOW_PACE_S)
    # The pace has its own stream, so a seed's faults are those it had before it was drawn.
    paces = [make_plan(seed, 20.0).pace for seed in range(400)]
    assert 60 < paces.count(FAST_PACE_S) < 140 and set(paces) == {FAST_PACE_S, SLOW_PACE_S}


def test_a_fault_shows_in_the_trace_and_the_cluster_recovers() -> None:
    plan = Plan(
        seed=6,
        duration=50.0,
        sites={f"n{i}": "s1" for i in range(1, 5)},
        initial=("n1", "n2", "n3", "n4"),
        net=Net(),
        faults=(Fault(15.0, "crash", "n2", 5.0), Fault(25.0, "freeze", "n3", 6.0)),
    )
    res = run_plan(plan, trace=True)
    assert res.ok, res.violations
    assert any("FAULT   15.00s crash n2" in line for line in res.trace)
    assert res.coverage["worker:rejoin"] + res.coverage["join:member"] >= 5  # back in


def test_a_seed_replays_exactly() -> None:
    first = replay(11, duration=30.0)  # twice, compared inside
    again = run_seed(11, duration=30.0)
    assert (again.digest, again.events) == (first.digest, first.events)
    assert run_seed(12, duration=30.0).digest != first.digest
    assert make_plan(11, 30.0) == make_plan(11, 30.0)


def test_a_leak_of_unseeded_randomness_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A harness bug (an unseeded random, real time) makes a seed stop replaying: the
    harness says so loudly instead of reporting findings nobody could reproduce."""
    step_pull = DataPlane.step_pull
    leak = random.Random()  # seeded from the OS: a different stream each run

    def leaky(self: DataPlane, pull: object) -> object:
        if leak.random() < 0.5:
            return "wait", None
        return step_pull(self, pull)  # type: ignore[arg-type]

    monkeypatch.setattr(DataPlane, "step_pull", leaky)
    with pytest.raises(HarnessError, match="does not replay"):
        replay(11, duration=30.0)


def test_a_coroutine_that_waits_on_real_time_is_refused() -> None:
    class RealWait:
        """Yields to an event loop, as a real sleep or socket read does."""

        def __await__(self) -> Generator[None, None, None]:
            yield

    async def sleeps() -> None:
        await RealWait()

    with pytest.raises(HarnessError, match="suspended"):
        drive(sleeps())
