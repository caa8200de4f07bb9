"""Planner registry: every planner is a pure function ``PlanInput -> ReplicationPlan``.

| name          | what                                                        | module      |
| ------------- | ----------------------------------------------------------- | ----------- |
| ``chaos``     | the paper's Algorithm 1 (binary search on s) + Algorithm 2  | greedy      |
| ``greedy``    | Algorithm 2 alone on the unsplit tensors                    | greedy      |
| ``waterfill`` | the optimum over contiguous byte ranges (water-filling)     | waterfill   |
| ``single``    | EDL+: everything from the fastest neighbour                 | waterfill   |
| ``even``      | Autoscaling: an even split over all given sources           | waterfill   |
| ``bruteforce``| optimal assignment of unsplit tensors, exhaustive (small)   | exact       |
| ``milp``      | the same optimum by MILP (needs scipy)                      | exact       |
"""

from __future__ import annotations

from collections.abc import Callable

from daemon.replication.errors import PlanError
from daemon.replication.planning.exact import brute_force_plan, milp_plan
from daemon.replication.planning.greedy import chaos_plan, greedy_plan
from daemon.replication.planning.model import PlanInput, ReplicationPlan
from daemon.replication.planning.waterfill import even_plan, single_plan, waterfill_plan

PlannerFn = Callable[[PlanInput], ReplicationPlan]

PLANNERS: dict[str, PlannerFn] = {
    "chaos": chaos_plan,
    "greedy": greedy_plan,
    "waterfill": waterfill_plan,
    "single": single_plan,
    "even": even_plan,
    "multi-source": even_plan,  # the strategy name in DESIGN.md; its planner is `even`
    "bruteforce": brute_force_plan,
    "milp": milp_plan,
}


def make_plan(name: str, inputs: PlanInput) -> ReplicationPlan:
    """Run the planner called ``name``.

    Raises:
        PlanError: If no planner has that name, or the planner cannot plan ``inputs``.
    """
    try:
        planner = PLANNERS[name]
    except KeyError:
        raise PlanError(f"unknown planner {name!r}; choose one of {sorted(PLANNERS)}") from None
    return planner(inputs)
