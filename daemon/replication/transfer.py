"""The data plane of scale-out state replication: one import for the daemon.

| what                                                  | where                                    |
| ----------------------------------------------------- | ---------------------------------------- |
| the immutable snapshot a neighbour serves             | :mod:`daemon.replication.snapshot`       |
| wire format, limits, errors, dialling, the manifest   | :mod:`daemon.replication.wire`           |
| the neighbour's state server (and hop-by-hop relay)   | :mod:`daemon.replication.serve`          |
| token-bucket pacing of a link                         | :mod:`daemon.replication.throttle`       |
| the new node's parallel, verified, self-healing fetch | :mod:`daemon.replication.fetch`          |
| fetch options and results                             | :mod:`daemon.replication.fetch_types`    |
| strategies: chaos, single, multi-source, stop-resume  | :mod:`daemon.replication.strategies`     |

Neighbour side, after the all-reduce of step t::

    state = StateSpace.capture(model, optimizer, runtime)      # the step-t copy
    server = serve(Snapshot.of(state), identity, is_allowed=neighbours.__contains__)
    ...                                                        # keep training step t+1
    server.close()                                             # once the new node has joined

New node, given the scheduler's plan and the neighbours' addresses::

    manifest = fetch_manifest(addresses[plan_source], identity, plan_source, version=t)
    result = fetch(plan, manifest, addresses, identity, progress=report)
    StateSpace.restore(model, optimizer, manifest, result.buffer)
"""

from daemon.replication.fetch import fetch
from daemon.replication.fetch_types import FetchOptions, FetchResult, ProgressFn, SourceTiming
from daemon.replication.serve import ServerStats, StateServer, serve
from daemon.replication.snapshot import Snapshot
from daemon.replication.strategies import STRATEGIES, ScaleOutJob, StrategyResult, run_strategy
from daemon.replication.throttle import TokenBucket
from daemon.replication.wire import (
    ProtocolError,
    RefusedError,
    TransferError,
    VersionMismatchError,
    fetch_manifest,
)

__all__ = [
    "STRATEGIES",
    "FetchOptions",
    "FetchResult",
    "ProgressFn",
    "ProtocolError",
    "RefusedError",
    "ScaleOutJob",
    "ServerStats",
    "Snapshot",
    "SourceTiming",
    "StateServer",
    "StrategyResult",
    "TokenBucket",
    "TransferError",
    "VersionMismatchError",
    "fetch",
    "fetch_manifest",
    "run_strategy",
    "serve",
]
