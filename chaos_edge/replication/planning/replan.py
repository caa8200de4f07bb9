"""Self-healing: re-plan a failed neighbour's undelivered bytes onto the survivors."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from chaos_edge.replication.errors import PlanError
from chaos_edge.replication.planning.model import (
    Neighbor,
    PlanInput,
    Range,
    ReplicationPlan,
    build_plan,
    merge_ranges,
    subtract_ranges,
)
from chaos_edge.replication.planning.waterfill import waterfill_plan

Planner = Callable[[PlanInput], ReplicationPlan]


def _queued_survivors(plan: ReplicationPlan, failed: str) -> list[Neighbor]:
    """Survivors that start the new work once their own share is done (the plan's estimate)."""
    out = []
    for n in plan.inputs.neighbors:
        if n.id == failed:
            continue
        # They keep serving their own ranges first, so they are ready when those finish.
        busy_until = plan.finish_s.get(n.id, n.ready_s)
        tau = max(0.0, busy_until - n.t_prop_s)
        out.append(Neighbor(n.id, n.t_prop_s, n.t_trans_s_per_byte, tau))
    return out


def _to_physical(virtual: Sequence[Range], pieces: Sequence[Range]) -> list[Range]:
    """Map ranges of the concatenation of ``pieces`` back to the pieces' real offsets."""
    out: list[Range] = []
    for v_off, v_len in virtual:
        base = 0
        for p_off, p_len in pieces:
            lo, hi = max(v_off, base), min(v_off + v_len, base + p_len)
            if lo < hi:
                out.append((p_off + lo - base, hi - lo))
            base += p_len
    return out


def replan_remaining(
    plan: ReplicationPlan,
    failed_neighbor: str,
    done_ranges: Sequence[Range],
    remaining: Sequence[Neighbor] | None = None,
    planner: Planner | None = None,
) -> ReplicationPlan:
    """Plan the bytes a failed neighbour has not delivered onto the other neighbours.

    Args:
        plan: The plan in force.
        failed_neighbor: Id of the neighbour that died or whose link failed.
        done_ranges: Byte ranges of the failed neighbour's share that arrived and verified.
        remaining: Survivors with fresh measurements (``tau_sync_s`` = when each can start).
            When None, the plan's other neighbours, each ready when its own share is done.
        planner: Planner for the undelivered bytes; water-filling when None.

    Returns:
        A plan whose ``ranges`` cover exactly the undelivered bytes, as real offsets of the
        state. Its ``inputs`` describe those bytes laid end to end (segments = the undelivered
        ranges' lengths); ``meta["remaining"]`` lists the real ranges.

    Raises:
        PlanError: If the neighbour is not in the plan or no survivor is left.
    """
    if failed_neighbor not in plan.ranges:
        raise PlanError(f"neighbor {failed_neighbor!r} is not in the plan")
    survivors = (
        [n for n in remaining if n.id != failed_neighbor]
        if remaining is not None
        else _queued_survivors(plan, failed_neighbor)
    )
    if not survivors:
        raise PlanError(f"no neighbor is left to take over from {failed_neighbor!r}")
    todo = subtract_ranges(plan.ranges[failed_neighbor], done_ranges)
    meta = {"failed": failed_neighbor, "remaining": [list(r) for r in todo]}
    if not todo:
        inputs = PlanInput(tuple(survivors), (1,), 1)  # nothing to move; a valid empty plan
        return build_plan(f"replan/{plan.planner}", inputs, {}, meta)
    inputs = PlanInput.create(survivors, [length for _, length in todo])
    virtual = (planner or waterfill_plan)(inputs)
    ranges = {nid: list(merge_ranges(_to_physical(rs, todo))) for nid, rs in virtual.ranges.items()}
    meta["planner"] = virtual.planner
    return ReplicationPlan(
        f"replan/{virtual.planner}",
        inputs,
        {k: tuple(v) for k, v in ranges.items()},
        virtual.finish_s,
        virtual.makespan_s,
        meta,
    )
