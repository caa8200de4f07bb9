"""The straggler judge as pure logic (issue 24): fake measurements in, verdicts out."""

from __future__ import annotations

import pytest

from daemon.cluster.controller import Candidate
from daemon.cluster.stragglers import RETRY_FACTOR_MAX, StragglerJudge, View
from daemon.contracts.clock import FakeClock
from daemon.contracts.config import AdaptiveConfig

pytestmark = pytest.mark.timeout(30)
EVERY_STEP = Candidate("every-step", "fp32")
ELEMENTS = 100_000  # a 400 kB gradient
FAST = 1000.0  # Mbit/s


def view(compute_ms: dict[str, float], slow: dict[str, float] | None = None,
         members: tuple[str, ...] = ("a", "b", "c"), readings: int = 1,
         policy: Candidate = EVERY_STEP, nodes: tuple[str, ...] = ("a", "b", "c")) -> View:
    """Every pair of ``nodes`` linked at FAST, a node's links at ``slow[node]`` Mbit/s."""
    slow = slow or {}
    links = {(x, y): (min(slow.get(x, FAST), slow.get(y, FAST)), 1.0)
             for i, x in enumerate(nodes) for y in nodes[i + 1:]}
    return View(members, {n: ms / 1000 for n, ms in compute_ms.items()}, links, ELEMENTS,
                policy, dict.fromkeys(links, readings))


def judge(**cfg: object) -> tuple[StragglerJudge, FakeClock]:
    clock = FakeClock()
    base: dict[str, object] = {"enabled": True, "dwell": 3, "min_interval_s": 0.0,
                               "straggler_retry_s": 60.0}
    settle = float(cfg.pop("settle_s", 0.0))  # type: ignore[arg-type]
    return StragglerJudge(AdaptiveConfig(**{**base, **cfg}), clock,  # type: ignore[arg-type]
                          settle_s=settle), clock


def test_a_slow_box_is_set_aside_for_its_compute_after_dwell_measurements() -> None:
    j, _clock = judge()
    v = view({"a": 50, "b": 50, "c": 400})  # throttled: 8x the others' step
    assert j.observe(v) is None and j.observe(v) is None  # dwell 3: not on two
    verdict = j.observe(v)
    assert verdict is not None and verdict.action == "set-aside" and verdict.node == "c"
    assert verdict.cause == "compute"
    # 3 members at 400 ms against 2 at 50 ms a step, each plus 3.2 ms of fp32 at 1 Gbit/s and
    # a millisecond's round trip.
    assert verdict.gain == pytest.approx(2 / 0.0542 / (3 / 0.4042) - 1, rel=0.01)
    assert verdict.step_s_with > 7 * verdict.step_s_without
    assert "c's compute slows the cluster" in verdict.reason()
    assert set(j.aside) == {"c"}


def test_noise_and_a_mildly_slow_box_never_set_anyone_aside() -> None:
    """A member at 1.4x the others' compute costs less than the third of the samples that
    its absence would: it stays, whatever the noise."""
    j, _clock = judge(dwell=1)
    for i in range(200):
        jitter = (i * 7919) % 13
        assert j.observe(view({"a": 50 + jitter, "b": 55 - jitter / 2, "c": 70 + jitter})) is None
    assert j.aside == {}


def test_a_box_on_a_slow_link_is_set_aside_and_rejoins_when_a_new_reading_says_it_recovered(
        ) -> None:
    j, _clock = judge(dwell=1)
    slow = view({"a": 50, "b": 50, "c": 50}, slow={"c": 2.0})  # 1.6 s of fp32 a round
    # Not on the reading that found it: only once a link of the others' is tested again.
    assert j.observe(slow) is None
    verdict = j.observe(view({"a": 50, "b": 50, "c": 50}, slow={"c": 2.0}, readings=2))
    assert verdict is not None and (verdict.node, verdict.cause) == ("c", "link")
    members = ("a", "b")
    # The same readings, or newer ones that are still slow: it waits aside.
    assert j.observe(view({"a": 50, "b": 50, "c": 50}, slow={"c": 2.0}, members=members)) is None
    assert j.observe(view({"a": 50, "b": 50, "c": 50}, slow={"c": 2.0}, members=members,
                          readings=2)) is None
    # Its links are back to speed, but no new test says so yet: still aside.
    assert j.observe(view({"a": 50, "b": 50, "c": 50}, members=members)) is None
    back = j.observe(view({"a": 50, "b": 50, "c": 50}, members=members, readings=3))
    assert back is not None and (back.action, back.node, back.cause) == (
        "rejoin", "c", "links-recovered")
    assert back.gain > 0.4 and j.aside == {}


def test_a_box_set_aside_for_its_compute_is_tried_again_and_waits_longer_each_time() -> None:
    j, clock = judge(dwell=1, straggler_retry_s=10.0)
    slow = {"a": 50.0, "b": 50.0, "c": 400.0}
    waits = []
    for _ in range(4):
        assert j.observe(view(slow)).node == "c"  # type: ignore[union-attr]
        aside_at = clock.monotonic()
        while (back := j.observe(view(slow, members=("a", "b")))) is None:
            clock.advance(1.0)
        assert (back.action, back.cause) == ("rejoin", "trial")
        waits.append(clock.monotonic() - aside_at)
    assert waits == [10.0, 20.0, 10.0 * RETRY_FACTOR_MAX, 10.0 * RETRY_FACTOR_MAX]
    # An hour on, a new set-aside counts from the start again.
    clock.advance(3600.0)
    assert j.observe(view(slow)).node == "c"  # type: ignore[union-attr]
    assert j.aside["c"].retry_at - clock.monotonic() == 10.0


def test_it_waits_min_interval_between_two_actions_and_acts_only_with_three_members() -> None:
    j, clock = judge(dwell=1, min_interval_s=30.0)
    two = view({"a": 50, "b": 400}, members=("a", "b"), nodes=("a", "b"))
    assert j.observe(two) is None  # one would be left: never
    four = view({"a": 50, "b": 50, "c": 400, "d": 400}, nodes=("a", "b", "c", "d"),
                members=("a", "b", "c", "d"))
    first = j.observe(four)
    assert first is not None and first.node == "c"
    # Either slow box alone gains nothing while the other holds every step back: the two
    # together do, and the slowest goes first (ties: by id), the next at a later measurement.
    assert first.step_s_without < 0.1
    rest = view({"a": 50, "b": 50, "c": 400, "d": 400}, nodes=("a", "b", "c", "d"),
                members=("a", "b", "d"))
    assert j.observe(rest) is None  # d too, but not within min_interval_s
    clock.advance(30.0)
    second = j.observe(rest)
    assert second is not None and second.node == "d"


def test_a_member_that_the_others_reach_only_through_is_never_set_aside() -> None:
    """c is slow, but a and b are linked only through it: without it they could not train."""
    j, _clock = judge(dwell=1)
    v = view({"a": 50, "b": 50, "c": 400})
    links = {k: rate for k, rate in v.links.items() if k != ("a", "b")}
    assert j.observe(View(v.members, v.compute_s, links, v.elements, v.policy)) is None


def test_a_box_aside_rejoins_at_once_when_too_few_members_are_left() -> None:
    j, _clock = judge(dwell=1)
    assert j.observe(view({"a": 50, "b": 50, "c": 400})) is not None
    back = j.observe(view({"a": 50, "c": 400}, members=("a",)))  # b went
    assert back is not None and (back.action, back.cause) == ("rejoin", "too-few")


def test_off_it_sets_no_one_aside_and_diloco_hides_a_slow_link() -> None:
    j, _clock = judge(dwell=1, stragglers=False)
    assert j.observe(view({"a": 50, "b": 50, "c": 400})) is None
    # Under DiLoCo with H=100 the round is paid once every 100 steps: a 5 Mbit/s link costs
    # 6 ms a step, not the third of the samples.
    j, _clock = judge(dwell=1)
    diloco = Candidate("diloco", "int8", 100)
    assert j.observe(view({"a": 50, "b": 50, "c": 50}, slow={"c": 5.0}, policy=diloco)) is None


def test_a_member_back_for_a_trial_is_watched_before_it_is_judged_again() -> None:
    """Its compute is a moving average: back for a trial, it still reads as slow as it was
    until it has trained for a while, so it is not set aside on that reading."""
    j, clock = judge(dwell=1, straggler_retry_s=10.0, settle_s=10.0)
    slow = {"a": 50.0, "b": 50.0, "c": 400.0}
    assert j.observe(view(slow)) is None  # everyone is new to the judge
    clock.advance(10.0)
    assert j.observe(view(slow)).node == "c"  # type: ignore[union-attr]
    clock.advance(10.0)
    assert j.observe(view(slow, members=("a", "b"))).cause == "trial"  # type: ignore[union-attr]
    for _ in range(5):  # 2 to 10 s back
        clock.advance(2.0)
        assert j.observe(view(slow)) is None
    clock.advance(2.0)
    assert j.observe(view(slow)).node == "c"  # type: ignore[union-attr]


def test_a_fall_of_every_rate_seen_link_by_link_sets_no_one_aside() -> None:
    """Every link falls to 20 Mbit/s; c's links are tested first, while a--b still reads
    1 Gbit/s from its last test: c looks like a link straggler until a--b is tested again
    (the adaptive bench, seed 10, set c aside so and let it back 2 s later)."""
    j, _clock = judge(dwell=1)
    compute = {"a": 50.0, "b": 50.0, "c": 50.0}
    half = view(compute, slow={"c": 20.0}, readings=2)
    half = View(half.members, half.compute_s, half.links, half.elements, half.policy,
                {**half.readings, ("a", "b"): 1})
    assert j.observe(half) is None
    assert j.observe(half) is None  # the same tests again: still waiting
    every = view(compute, slow={"a": 20.0, "b": 20.0, "c": 20.0}, readings=2)
    assert j.observe(every) is None and j.aside == {}
