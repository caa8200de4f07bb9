"""Scale-out state replication: planning (pure) and transfer (I/O).

Runs in the training worker (the sources' servers and the new node's fetch, on threads) and
in the benches. ``planning`` is pure numpy with no I/O; ``transfer`` does the sockets.

- training state as one byte space; restore; digest: :mod:`chaos_edge.replication.state`
- manifest, block checksums, range verification: :mod:`chaos_edge.replication.manifest`
- planner inputs, plans, the cost model, coverage: :mod:`chaos_edge.replication.planning.model`
- the default plan (water-filling to the byte), the lower bound, baselines:
  :mod:`chaos_edge.replication.planning.waterfill`
- the paper's Algorithms 1 and 2 (planner ``paper``, a baseline):
  :mod:`chaos_edge.replication.planning.greedy`
- brute force and MILP optima (small instances): :mod:`chaos_edge.replication.planning.exact`
- re-planning a failed neighbour's bytes: :mod:`chaos_edge.replication.planning.replan`
- the planner registry: :mod:`chaos_edge.replication.planning.planner`
- the data plane: serve, fetch, strategies (I/O): :mod:`chaos_edge.replication.transfer`

``state`` imports torch; the planner modules need only numpy (scipy for ``milp``).
"""

from chaos_edge.replication.errors import (
    CorruptStateError,
    ManifestError,
    PlanError,
    ReplicationError,
)
from chaos_edge.replication.planning.model import Neighbor, PlanInput, ReplicationPlan, check_cover
from chaos_edge.replication.planning.planner import PLANNERS, make_plan
from chaos_edge.replication.planning.replan import replan_remaining
from chaos_edge.replication.planning.waterfill import lower_bound
from chaos_edge.replication.transfer import (
    STRATEGIES,
    FetchOptions,
    FetchResult,
    Snapshot,
    TransferError,
    VersionMismatchError,
    fetch,
    fetch_manifest,
    run_strategy,
    serve,
)

__all__ = [
    "PLANNERS",
    "STRATEGIES",
    "CorruptStateError",
    "FetchOptions",
    "FetchResult",
    "ManifestError",
    "Neighbor",
    "PlanError",
    "PlanInput",
    "ReplicationError",
    "ReplicationPlan",
    "Snapshot",
    "TransferError",
    "VersionMismatchError",
    "check_cover",
    "fetch",
    "fetch_manifest",
    "lower_bound",
    "make_plan",
    "replan_remaining",
    "run_strategy",
    "serve",
]
