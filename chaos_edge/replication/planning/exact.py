"""Exact optima of P3 (a fixed set of shards) for small instances: brute force and MILP.

Both use the cost model of :mod:`chaos_edge.replication.planning.model`: neighbour ``u`` finishes at
``a_u + t_u * (bytes it sends)`` if it sends anything. They measure Algorithm 2's gap on the same
shards, as the paper's Fig. 16 does. scipy is imported lazily: it is a test and bench dependency.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from chaos_edge.replication.errors import PlanError
from chaos_edge.replication.planning.model import (
    Neighbor,
    PlanInput,
    Range,
    ReplicationPlan,
    build_plan,
)

BRUTE_FORCE_LIMIT = 2_000_000  # assignments; |U|^K beyond this is refused


def assignment_makespan(
    shard_sizes: Sequence[int], owner: Sequence[int], neighbors: Sequence[Neighbor]
) -> float:
    """Makespan of giving shard ``k`` to neighbour ``owner[k]``."""
    nbytes = [0] * len(neighbors)
    for size, u in zip(shard_sizes, owner, strict=True):
        nbytes[u] += size
    return max(n.finish_s(b) for n, b in zip(neighbors, nbytes, strict=True))


def brute_force_assign(
    shard_sizes: Sequence[int], neighbors: Sequence[Neighbor]
) -> tuple[list[int], float]:
    """Search every assignment of shards to neighbours (depth first, pruned by the best so far).

    Pruning only skips branches that already finish no earlier than the best complete
    assignment, so the result is exact.

    Returns:
        The best owner list and its makespan.

    Raises:
        PlanError: If there are more than :data:`BRUTE_FORCE_LIMIT` assignments.
    """
    k, n = len(shard_sizes), len(neighbors)
    if n**k > BRUTE_FORCE_LIMIT:
        raise PlanError(f"brute force over {n}^{k} assignments is too large")
    ready = [x.ready_s for x in neighbors]
    t = [x.t_trans_s_per_byte for x in neighbors]
    order = sorted(range(k), key=lambda j: -shard_sizes[j])  # big shards first: prunes sooner
    nbytes = [0] * n
    owner = [0] * k
    best: list[float] = [float("inf")]
    best_owner: list[int] = []

    def visit(depth: int, span: float) -> None:
        if span >= best[0]:
            return
        if depth == k:
            best[0] = span
            best_owner[:] = owner
            return
        j = order[depth]
        size = shard_sizes[j]
        for u in range(n):
            nbytes[u] += size
            owner[j] = u
            visit(depth + 1, max(span, ready[u] + t[u] * nbytes[u]))
            nbytes[u] -= size

    visit(0, 0.0)
    return best_owner, best[0]


def milp_assign(
    shard_sizes: Sequence[int], neighbors: Sequence[Neighbor], time_limit_s: float = 60.0
) -> tuple[list[int], float]:
    """Solve P3 as a MILP with ``scipy.optimize.milp``.

    Variables: ``x[u, k]`` (shard k from u), ``y[u]`` (u sends something), ``theta``.
    Minimise ``theta`` subject to ``sum_u x[u, k] = 1``, ``x[u, k] <= y[u]`` and
    ``a_u y[u] + t_u sum_k size_k x[u, k] <= theta``.

    Returns:
        The best owner list and its makespan.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp  # test/bench-only dependency
    from scipy.sparse import lil_matrix

    n, k = len(neighbors), len(shard_sizes)
    nx = n * k
    nvar = nx + n + 1
    # Scale by an upper bound on the optimum (everything from the best single neighbour), so
    # theta is ~1 and HiGHS's absolute tolerances (~1e-7) cannot hide a real difference. A
    # neighbour that cannot start before that bound is useless: fix it to 0 rather than
    # feed the solver a huge coefficient.
    scale = min(nb.finish_s(sum(shard_sizes)) for nb in neighbors)
    useless = [nb.ready_s > scale for nb in neighbors]
    cost = np.zeros(nvar)
    cost[-1] = 1.0
    rows = lil_matrix((k + nx + n, nvar))
    lo, hi = [], []
    for j in range(k):  # every shard exactly once
        for u in range(n):
            rows[j, u * k + j] = 1.0
        lo.append(1.0)
        hi.append(1.0)
    r = k
    for u in range(n):  # x[u, j] <= y[u]
        for j in range(k):
            rows[r, u * k + j] = 1.0
            rows[r, nx + u] = -1.0
            lo.append(-np.inf)
            hi.append(0.0)
            r += 1
    for u, nb in enumerate(neighbors):  # finish time of u <= theta
        for j, size in enumerate(shard_sizes):
            rows[r, u * k + j] = nb.t_trans_s_per_byte * size / scale
        rows[r, nx + u] = min(nb.ready_s / scale, 2.0)
        rows[r, -1] = -1.0
        lo.append(-np.inf)
        hi.append(0.0)
        r += 1
    integrality = np.ones(nvar)
    integrality[-1] = 0
    upper = np.ones(nvar)
    upper[-1] = np.inf
    for u in range(n):
        if useless[u]:
            upper[u * k : (u + 1) * k] = 0.0
            upper[nx + u] = 0.0
    res = milp(
        cost,
        constraints=LinearConstraint(rows.tocsr(), lo, hi),
        integrality=integrality,
        bounds=Bounds(np.zeros(nvar), upper),
        options={"time_limit": time_limit_s, "mip_rel_gap": 1e-9},
    )
    if res.x is None:
        raise PlanError(f"MILP found no solution: {res.message}")
    x = res.x[:nx].reshape(n, k)
    owner = [int(np.argmax(x[:, j])) for j in range(k)]
    return owner, assignment_makespan(shard_sizes, owner, neighbors)


def _owner_ranges(inputs: PlanInput, owner: Sequence[int]) -> dict[str, list[Range]]:
    offsets = np.concatenate(([0], np.cumsum(inputs.segments)[:-1])).tolist()
    ranges: dict[str, list[Range]] = {n.id: [] for n in inputs.neighbors}
    for off, size, u in zip(offsets, inputs.segments, owner, strict=True):
        ranges[inputs.neighbors[u].id].append((int(off), size))
    return ranges


def brute_force_plan(inputs: PlanInput) -> ReplicationPlan:
    """Optimal assignment of the segments (as unsplit shards), by exhaustive search."""
    owner, _ = brute_force_assign(inputs.segments, inputs.neighbors)
    return build_plan("bruteforce", inputs, _owner_ranges(inputs, owner))


def milp_plan(inputs: PlanInput) -> ReplicationPlan:
    """Optimal assignment of the segments (as unsplit shards), by MILP (needs scipy)."""
    owner, _ = milp_assign(inputs.segments, inputs.neighbors)
    return build_plan("milp", inputs, _owner_ranges(inputs, owner))
