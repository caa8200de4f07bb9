"""The data plane of scale-out state replication: one import for the daemon.

- the immutable snapshot a neighbour serves: :mod:`daemon.replication.transfer.snapshot`
- wire format, limits, errors, dialling, the manifest: :mod:`daemon.replication.transfer.wire`
- the neighbour's state server (and hop-by-hop relay): :mod:`daemon.replication.transfer.serve`
- token-bucket pacing of a link: :mod:`daemon.replication.transfer.throttle`
- the new node's parallel, verified, self-healing fetch: :mod:`daemon.replication.transfer.fetch`
- fetch options and results: :mod:`daemon.replication.transfer.fetch_types`
- the fetch's bookkeeping (requests, arrivals, steals, re-plans):
  :mod:`daemon.replication.transfer.ledger`
- run-time rebalancing (rates, request sizes, steals): :mod:`daemon.replication.transfer.balance`
- the four strategies: :mod:`daemon.replication.transfer.strategies`

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

from daemon.replication.transfer.fetch import fetch
from daemon.replication.transfer.fetch_types import (
    FetchOptions,
    FetchResult,
    ProgressFn,
    SourceTiming,
    Steal,
)
from daemon.replication.transfer.serve import ServerStats, StateServer, serve
from daemon.replication.transfer.snapshot import Snapshot
from daemon.replication.transfer.strategies import (
    STRATEGIES,
    ScaleOutJob,
    StrategyResult,
    run_strategy,
)
from daemon.replication.transfer.throttle import TokenBucket
from daemon.replication.transfer.wire import (
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
    "Steal",
    "StrategyResult",
    "TokenBucket",
    "TransferError",
    "VersionMismatchError",
    "fetch",
    "fetch_manifest",
    "run_strategy",
    "serve",
]
