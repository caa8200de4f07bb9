"""The data plane of scale-out state replication: one import for the daemon.

- the immutable snapshot a neighbour serves: :mod:`chaos_edge.replication.transfer.snapshot`
- wire format, limits, errors, dialling, the manifest: :mod:`chaos_edge.replication.transfer.wire`
- the neighbour's state server (and hop-by-hop relay): :mod:`chaos_edge.replication.transfer.serve`
- token-bucket pacing of a link: :mod:`chaos_edge.replication.transfer.throttle`
- the new node's parallel, verified, self-healing fetch: :mod:`~.fetch`
- fetch options and results: :mod:`chaos_edge.replication.transfer.fetch_types`
- the fetch's bookkeeping (requests, arrivals, steals, re-plans):
  :mod:`chaos_edge.replication.transfer.ledger`
- run-time rebalancing (rates, request sizes, steals): :mod:`~.balance`
- the four strategies: :mod:`chaos_edge.replication.transfer.strategies`

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

from chaos_edge.replication.transfer.fetch import fetch
from chaos_edge.replication.transfer.fetch_types import (
    FetchOptions,
    FetchResult,
    ProgressFn,
    SourceTiming,
    Steal,
)
from chaos_edge.replication.transfer.serve import ServerStats, StateServer, serve
from chaos_edge.replication.transfer.snapshot import Snapshot
from chaos_edge.replication.transfer.strategies import (
    STRATEGIES,
    ScaleOutJob,
    StrategyResult,
    run_strategy,
)
from chaos_edge.replication.transfer.throttle import TokenBucket
from chaos_edge.replication.transfer.wire import (
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
