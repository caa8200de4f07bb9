"""Planner properties: exact cover, lower bound, Algorithm 2 fidelity, optimality gaps, JSON."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from chaos_edge.replication.errors import PlanError
from chaos_edge.replication.planning.exact import (
    assignment_makespan,
    brute_force_assign,
    milp_assign,
)
from chaos_edge.replication.planning.greedy import (
    algorithm1,
    greedy_assign,
    greedy_runs,
    lpt_order,
    split_shards,
)
from chaos_edge.replication.planning.model import Neighbor, PlanInput, ReplicationPlan, check_cover
from chaos_edge.replication.planning.planner import PLANNERS, make_plan
from chaos_edge.replication.planning.waterfill import assign_identical, lower_bound

pytestmark = pytest.mark.timeout(120)

FAST = ["chaos", "paper", "greedy", "waterfill", "single", "even"]
REL = 1e-9


@st.composite
def neighbors(draw: st.DrawFn, max_n: int = 6, identical: bool = False) -> list[Neighbor]:
    n = draw(st.integers(1, max_n))
    if identical:
        t = draw(st.floats(1e-9, 1e-6))
        a = draw(st.floats(0.0, 1.0))
        return [Neighbor(f"n{i}", a, t, 0.0) for i in range(n)]
    return [
        Neighbor(
            f"n{i}",
            draw(st.floats(0.0, 0.1)),
            draw(st.floats(1e-9, 1e-6)),
            draw(st.floats(0.0, 1.0)),
        )
        for i in range(n)
    ]


segments = st.lists(st.integers(1, 200_000), min_size=1, max_size=12)


@st.composite
def plan_inputs(draw: st.DrawFn) -> PlanInput:
    align = draw(st.sampled_from([1, 1, 7, 4096]))
    return PlanInput.create(draw(neighbors()), draw(segments), align)


def _slowest(inputs: PlanInput) -> float:
    return max(n.t_trans_s_per_byte for n in inputs.neighbors)


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_every_plan_covers_once_and_respects_the_lower_bound(inputs: PlanInput) -> None:
    lb = lower_bound(inputs)
    best = make_plan("waterfill", inputs)
    for name in FAST:
        plan = make_plan(name, inputs)
        check_cover(plan)
        assert plan.makespan_s >= lb * (1 - REL)
        if inputs.align_bytes == 1:  # waterfill is the integer optimum over any byte split
            assert best.makespan_s <= plan.makespan_s * (1 + REL)
        again = ReplicationPlan.from_dict(json.loads(plan.to_json()))
        assert again.to_dict() == plan.to_dict()
    # Rounding to whole units costs at most one unit on the slowest neighbour.
    slack = (inputs.align_bytes + 1) * _slowest(inputs)
    assert best.makespan_s <= lb + slack + lb * REL


@settings(max_examples=150, deadline=None)
@given(plan_inputs())
def test_algorithm2_stays_within_one_shard_of_the_water_level(inputs: PlanInput) -> None:
    # Whenever a shard is placed, some neighbour is still below the water level, so every
    # finish time is below the level plus one shard on the slowest neighbour.
    lb = lower_bound(inputs)
    paper = make_plan("paper", inputs)
    shard = min(int(paper.meta["shard_size"]), max(inputs.segments))
    assert paper.makespan_s <= lb + shard * _slowest(inputs) + lb * REL
    greedy = make_plan("greedy", inputs)
    assert greedy.makespan_s <= lb + max(inputs.segments) * _slowest(inputs) + lb * REL


@settings(max_examples=200, deadline=None)
@given(neighbors(), segments, st.data())
def test_batched_algorithm2_matches_the_one_by_one_loop(
    nbs: list[Neighbor], segs: list[int], data: st.DataObject
) -> None:
    s = data.draw(st.integers(max(1, max(segs) // 50), max(segs)))
    shards = split_shards(segs, s)
    ordered = [shards[k] for k in lpt_order(shards)]
    reference = assignment_makespan(ordered, greedy_assign(ordered, nbs), nbs)
    ready = np.array([n.ready_s for n in nbs])
    t = np.array([n.t_trans_s_per_byte for n in nbs])
    fast = greedy_runs(np.array(segs), s, ready, t)
    assert fast.makespan_s == pytest.approx(reference, rel=REL)
    assert int(fast.full.sum()) == sum(x // s for x in segs)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.floats(0.0, 10.0), min_size=1, max_size=70),
    st.floats(1e-3, 1.0),
    st.integers(0, 5000),
)
def test_assign_identical_is_the_greedy_loop(load: list[float], cost: float, count: int) -> None:
    loads = np.array(load)
    costs = cost * (1 + np.arange(len(load)) % 3)
    counts = assign_identical(loads, costs, count)
    assert counts.sum() == count and (counts >= 0).all()
    # The greedy's outcome: no item could move and finish earlier (up to float ties).
    if count:
        last = np.where(counts > 0, loads + counts * costs, -np.inf).max()
        assert (loads + (counts + 1) * costs).min() >= last * (1 - REL) - 1e-12


@settings(max_examples=80, deadline=None)
@given(neighbors(max_n=3), st.lists(st.integers(1, 100), min_size=1, max_size=7))
def test_brute_force_is_no_worse_than_greedy(nbs: list[Neighbor], shards: list[int]) -> None:
    ordered = [shards[k] for k in lpt_order(shards)]
    greedy = assignment_makespan(ordered, greedy_assign(ordered, nbs), nbs)
    owner, best = brute_force_assign(ordered, nbs)
    assert best == pytest.approx(assignment_makespan(ordered, owner, nbs))
    assert best <= greedy * (1 + REL)


@settings(max_examples=80, deadline=None)
@given(neighbors(max_n=4, identical=True), st.lists(st.integers(1, 100), min_size=1, max_size=8))
def test_graham_bound_for_identical_neighbors(nbs: list[Neighbor], shards: list[int]) -> None:
    # The paper's statement: Algorithm 2 reduces to LPT for P||Cmax, so it is within
    # (4/3 - 1/(3|U|)) of OPT. That reduction needs identical neighbours and LPT order.
    ordered = [shards[k] for k in lpt_order(shards)]
    greedy = assignment_makespan(ordered, greedy_assign(ordered, nbs), nbs)
    _, best = brute_force_assign(ordered, nbs)
    assert greedy <= (4 / 3 - 1 / (3 * len(nbs))) * best * (1 + REL)


def test_graham_bound_does_not_hold_for_heterogeneous_links() -> None:
    # Two links at 1/3 and 1/4 byte/s: LPT gives 30 s, the optimum 24 s, a ratio of 1.25,
    # above the 7/6 the paper quotes for |U| = 2. (For related machines the LPT bound is
    # (1 + sqrt(17)) / 4 ~ 1.28 for two machines; Gonzalez, Ibarra and Sahni, 1977.)
    nbs = [Neighbor("a", 0.0, 3.0), Neighbor("b", 0.0, 4.0)]
    shards = [6, 4, 4]
    greedy = assignment_makespan(shards, greedy_assign(shards, nbs), nbs)
    _, best = brute_force_assign(shards, nbs)
    assert (greedy, best) == (30.0, 24.0)
    assert greedy / best > 4 / 3 - 1 / 6


@settings(max_examples=25, deadline=None)
@given(neighbors(max_n=3), st.lists(st.integers(1, 100), min_size=1, max_size=5))
# CI found this one: a neighbour that is busy for a second used to set the MILP's scale, so
# the two useful links' microsecond difference fell inside the solver's tolerance.
@example(
    [
        Neighbor("n0", 0.0, 4.4188e-07),
        Neighbor("n1", 0.0, 1.7047e-07),
        Neighbor("n2", 0.0, 1e-9, 1.0),
    ],
    [1],
)
def test_milp_agrees_with_brute_force(nbs: list[Neighbor], shards: list[int]) -> None:
    pytest.importorskip("scipy")
    _, best = brute_force_assign(shards, nbs)
    _, milp = milp_assign(shards, nbs)
    assert milp == pytest.approx(best, rel=1e-6)


def test_exact_planners_cover_and_beat_greedy_on_tensors() -> None:
    pytest.importorskip("scipy")
    nbs = [Neighbor("a", 0.01, 1e-8, 0.2), Neighbor("b", 0.0, 3e-8, 0.0), Neighbor("c", 0.0, 2e-8)]
    inputs = PlanInput.create(nbs, [4_000_000, 3_000_000, 1_000_000, 900_000, 50_000, 7])
    bf, milp, greedy = (make_plan(n, inputs) for n in ("bruteforce", "milp", "greedy"))
    for plan in (bf, milp, greedy):
        check_cover(plan)
    assert bf.makespan_s == pytest.approx(milp.makespan_s, rel=1e-6)
    assert bf.makespan_s <= greedy.makespan_s


def test_algorithm1_searches_the_paper_range_and_improves_on_raw_tensors() -> None:
    nbs = [Neighbor(f"n{i}", 0.001 * i, 1e-8 * (1 + i), 0.05 * i) for i in range(8)]
    segs = [50_000_000, 20_000_000, 4_000_000] + [40_000] * 30
    inputs = PlanInput.create(nbs, segs)
    best, calls = algorithm1(inputs)
    assert min(segs) <= best.s <= max(segs)
    assert calls <= int(np.ceil(np.log2(max(segs) - min(segs) + 2))) + 1
    assert make_plan("paper", inputs).makespan_s < make_plan("greedy", inputs).makespan_s


def test_baselines_and_registry() -> None:
    nbs = [Neighbor("slow", 0.0, 1e-6), Neighbor("fast", 0.0, 1e-8), Neighbor("mid", 0.0, 1e-7)]
    inputs = PlanInput.create(nbs, [1000, 2001])
    single = make_plan("single", inputs)
    assert single.ranges["fast"] == ((0, 3001),) and single.meta["source"] == "fast"
    even = make_plan("even", inputs)
    assert [even.bytes_of(n.id) for n in nbs] == [1001, 1000, 1000]
    assert set(FAST) <= set(PLANNERS)
    with pytest.raises(PlanError, match="unknown planner"):
        make_plan("nope", inputs)


@pytest.mark.parametrize(
    "build",
    [
        lambda: PlanInput.create([], [1]),
        lambda: PlanInput.create([Neighbor("a", 0, 1e-9), Neighbor("a", 0, 1e-9)], [1]),
        lambda: PlanInput.create([Neighbor("a", 0, 1e-9)], [0]),
        lambda: PlanInput((Neighbor("a", 0, 1e-9),), (5,), 6),
        lambda: Neighbor("a", 0.0, 0.0),
        lambda: Neighbor("a", -1.0, 1e-9),
        lambda: PlanInput.from_dict({"neighbors": [{"id": "a"}], "segments": [1]}),
    ],
)
def test_bad_inputs_are_rejected(build: object) -> None:
    with pytest.raises(PlanError):
        build()  # type: ignore[operator]
