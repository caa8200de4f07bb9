"""Planner registry: every planner is a pure function ``PlanInput -> ReplicationPlan``.

| name          | what                                                        | module      |
| ------------- | ----------------------------------------------------------- | ----------- |
| ``chaos``     | the default: water-filling to the byte, the exact optimum   | waterfill   |
| ``paper``     | the paper's Algorithm 1 (binary search on s) + Algorithm 2  | greedy      |
| ``greedy``    | Algorithm 2 alone on the unsplit tensors                    | greedy      |
| ``waterfill`` | water-filling with boundaries on ``align_bytes`` multiples  | waterfill   |
| ``single``    | EDL+: everything from the fastest neighbour                 | waterfill   |
| ``even``      | Autoscaling: an even split over all given sources           | waterfill   |
| ``bruteforce``| optimal assignment of unsplit tensors, exhaustive (small)   | exact       |
| ``milp``      | the same optimum by MILP (needs scipy)                      | exact       |

``chaos`` is what the ``chaos`` strategy (and so a joining node) uses unless told otherwise. Its
makespan is never above any other plan's, ``waterfill`` and ``paper`` included, whatever the
tensor sizes, and it decides in well under 1 ms for 64 neighbours (see
:func:`~chaos_edge.replication.planning.waterfill.chaos_plan`). ``paper`` keeps the paper's
planner by name, as the baseline the benchmarks report beside it.
"""

from __future__ import annotations

from collections.abc import Callable

from chaos_edge.replication.errors import PlanError
from chaos_edge.replication.planning.exact import brute_force_plan, milp_plan
from chaos_edge.replication.planning.greedy import greedy_plan, paper_plan
from chaos_edge.replication.planning.model import PlanInput, ReplicationPlan
from chaos_edge.replication.planning.waterfill import (
    chaos_plan,
    even_plan,
    single_plan,
    waterfill_plan,
)

PlannerFn = Callable[[PlanInput], ReplicationPlan]

PLANNERS: dict[str, PlannerFn] = {
    "chaos": chaos_plan,
    "paper": paper_plan,
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
