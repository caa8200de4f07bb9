"""Self-healing: a failed neighbour's undelivered bytes go to the survivors, exactly once."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from chaos_edge.replication.errors import PlanError
from chaos_edge.replication.planning.greedy import paper_plan
from chaos_edge.replication.planning.model import (
    Neighbor,
    PlanInput,
    check_cover,
    merge_ranges,
    subtract_ranges,
)
from chaos_edge.replication.planning.planner import make_plan
from chaos_edge.replication.planning.replan import replan_remaining

pytestmark = pytest.mark.timeout(120)

NBS = [Neighbor(f"n{i}", 0.001 * i, 1e-8 * (1 + i % 3), 0.01 * i) for i in range(5)]


@settings(max_examples=150, deadline=None)
@given(
    st.sampled_from(["chaos", "paper", "waterfill", "even", "single"]),
    st.lists(st.integers(1, 100_000), min_size=1, max_size=10),
    st.integers(0, 4),
    st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), max_size=4),
    st.booleans(),
)
def test_replan_covers_exactly_the_undelivered_bytes(
    name: str,
    segs: list[int],
    failed_index: int,
    done_fracs: list[tuple[float, float]],
    fresh: bool,
) -> None:
    plan = make_plan(name, PlanInput.create(NBS, segs))
    failed = NBS[failed_index].id
    # Pieces of the failed neighbour's ranges that did arrive.
    done = []
    for (off, length), (f0, f1) in zip(plan.ranges[failed], done_fracs, strict=False):
        lo, hi = sorted((int(f0 * length), int(f1 * length)))
        done.append((off + lo, hi - lo))
    survivors = [n for n in NBS if n.id != failed] if fresh else None
    healed = replan_remaining(plan, failed, done, survivors, paper_plan if fresh else None)
    expected = subtract_ranges(plan.ranges[failed], done)
    check_cover(healed, expected)
    assert healed.ranges.get(failed, ()) == ()
    assert [list(r) for r in expected] == healed.meta["remaining"]
    # What arrived, the survivors' own shares and the new ranges make the state, once.
    pieces = [r for nid, rs in plan.ranges.items() if nid != failed for r in rs]
    pieces += [r for r in done if r[1]] + [r for rs in healed.ranges.values() for r in rs]
    assert sum(n for _, n in pieces) == plan.inputs.total_bytes
    assert merge_ranges(pieces) == ((0, plan.inputs.total_bytes),)


def test_survivors_start_after_their_own_share() -> None:
    plan = make_plan("waterfill", PlanInput.create(NBS, [10_000_000]))
    healed = replan_remaining(plan, "n0", [])
    for nid, finish in healed.finish_s.items():
        assert finish > plan.finish_s[nid]


def test_replan_errors() -> None:
    plan = make_plan("single", PlanInput.create(NBS[:1], [100]))
    with pytest.raises(PlanError, match="no neighbor"):
        replan_remaining(plan, "n0", [])
    with pytest.raises(PlanError, match="not in the plan"):
        replan_remaining(plan, "zz", [])
    full = make_plan("even", PlanInput.create(NBS, [100]))
    nothing = replan_remaining(full, "n1", list(full.ranges["n1"]))
    assert all(not v for v in nothing.ranges.values())
