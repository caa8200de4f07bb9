"""Scale-out state replication: planning (pure) and transfer (I/O).

Runs in the training worker (the sources' servers and the new node's fetch, on threads) and
in the benches. ``planning`` is pure numpy with no I/O; ``transfer`` does the sockets.

- training state as one byte space; restore; digest: :mod:`daemon.replication.state`
- manifest, block checksums, range verification: :mod:`daemon.replication.manifest`
- planner inputs, plans, the cost model, coverage: :mod:`daemon.replication.planning.model`
- the default plan (water-filling to the byte), the lower bound, baselines:
  :mod:`daemon.replication.planning.waterfill`
- the paper's Algorithms 1 and 2 (planner ``paper``, a baseline):
  :mod:`daemon.replication.planning.greedy`
- brute force and MILP optima (small instances): :mod:`daemon.replication.planning.exact`
- re-planning a failed neighbour's bytes: :mod:`daemon.replication.planning.replan`
- the planner registry: :mod:`daemon.replication.planning.planner`
- the data plane: serve, fetch, strategies (I/O): :mod:`daemon.replication.transfer`

``state`` imports torch; the planner modules need only numpy (scipy for ``milp``).
"""

from daemon.replication.errors import (
    CorruptStateError,
    ManifestError,
    PlanError,
    ReplicationError,
)
from daemon.replication.planning.model import Neighbor, PlanInput, ReplicationPlan, check_cover
from daemon.replication.planning.planner import PLANNERS, make_plan
from daemon.replication.planning.replan import replan_remaining
from daemon.replication.planning.waterfill import lower_bound
from daemon.replication.transfer import (
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
