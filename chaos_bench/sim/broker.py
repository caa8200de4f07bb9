"""The broker's load against the cluster's size, and where one broker saturates.

A broker's work is a cost per message it takes in plus a cost per copy it delivers, which grows
with the copy's bytes (:class:`BrokerModel`, measured on mosquitto by
:mod:`chaos_bench.sim.rate`).
Two subscription patterns for the 2 Hz heartbeats:

- ``all-to-all`` (round 1): every node subscribes to ``node/+/hb``, so each heartbeat goes to
  all N nodes: 2 N^2 deliveries/s (the control bench measured 289/s at 12 nodes);
- ``leader-only`` (issue 12's O(N) pattern): only the scheduler hears every heartbeat and the
  followers hear the scheduler's: 2 N + 2 (N - 1) deliveries/s.

The retained ``cluster/state`` snapshot goes to every node at each membership change; its size
is the real :meth:`Scheduler.snapshot <daemon.cluster.scheduler.Scheduler.snapshot>` of a
cluster of N active nodes on the testbed's topology, with its full policy history and the
agent's per-node stamps, encoded as the daemon encodes it (packed, see
:mod:`daemon.contracts.statepack`).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import json
import random
import time
from dataclasses import dataclass

from chaos_bench.sim.topology import random_links
from daemon.cluster.primitives import Negotiator, measured
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import FakeClock
from daemon.contracts.messages import (
    MAX_PAYLOAD,
    PROTOCOL_VERSION,
    ClusterState,
    LinkRecord,
    encode_state,
)
from daemon.contracts.policy import POLICY_KEEP

PATTERNS = ("all-to-all", "leader-only")
HB_HZ = 2.0
HB_BYTES = 180  # the control bench: 4340 bytes/s over 24.1 publishes/s at 12 nodes
# Snapshot sizes measured with the real scheduler (packed, the bytes per node grow slowly
# with N, so they are measured out to where the limit is).
FIT_SIZES = (25, 100, 400, 1600, 6400)
PROBE_RTT_MS = (0.1, 5.0)  # a probed link's RTT, drawn uniformly (an upper bound for packing)


@dataclass(frozen=True)
class BrokerModel:
    """CPU seconds the broker spends per message in, per copy out, and per byte out."""

    per_publish_s: float
    per_delivery_s: float
    per_byte_s: float

    def cost(self, publishes: float, deliveries: float, nbytes: float) -> float:
        """Broker CPU seconds for ``publishes`` in and ``deliveries`` copies of ``nbytes``."""
        return (publishes * self.per_publish_s + deliveries * self.per_delivery_s
                + nbytes * self.per_byte_s)

    def service_rate(self, payload: int = HB_BYTES) -> float:
        """Deliveries per second one broker core sustains for ``payload``-byte messages."""
        return 1.0 / (self.per_delivery_s + payload * self.per_byte_s)


def heartbeat_load(n: int, pattern: str) -> tuple[float, float]:
    """(publishes/s, deliveries/s) of the 2 Hz heartbeats of ``n`` nodes."""
    pubs = HB_HZ * n
    if pattern == "all-to-all":
        return pubs, pubs * n
    return pubs, pubs + HB_HZ * (n - 1)


def utilisation(n: int, pattern: str, model: BrokerModel, churn_per_s: float = 0.0) -> float:
    """Fraction of one broker core busy with heartbeats and the snapshots of ``churn_per_s``
    membership changes per second (each one snapshot to every node)."""
    pubs, dels = heartbeat_load(n, pattern)
    busy = model.cost(pubs, dels, dels * HB_BYTES)
    snap = snapshot_bytes(n)
    busy += model.cost(churn_per_s, churn_per_s * n, churn_per_s * n * snap)
    return busy


def saturation_n(pattern: str, model: BrokerModel, churn_per_node_h: float = 0.0,
                 limit: int = 10_000_000) -> int:
    """The largest cluster one broker core carries (utilisation below 1), by bisection."""
    def load(n: int) -> float:
        return utilisation(n, pattern, model, churn_per_node_h * n / 3600.0)

    lo, hi = 1, 2
    while hi < limit and load(hi) < 1.0:
        lo, hi = hi, hi * 2
    if hi >= limit:
        return limit
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if load(mid) < 1.0 else (lo, mid)
    return lo


@functools.cache
def _snapshot_points() -> tuple[tuple[int, int], ...]:
    """The real snapshot's encoded size at each of :data:`FIT_SIZES`."""
    return tuple((n, measure_snapshot(n)) for n in FIT_SIZES)


def snapshot_bytes(n: int) -> float:
    """The retained snapshot's size for ``n`` active nodes: measured at :data:`FIT_SIZES`,
    straight lines between them, and the last segment's line beyond (packed, the size per
    node grows a little with N: node indices get longer)."""
    pts = _snapshot_points()
    lo, hi = pts[0], pts[1]
    for a, b in itertools.pairwise(pts):
        lo, hi = a, b
        if n <= b[0]:
            break
    slope = (hi[1] - lo[1]) / (hi[0] - lo[0])
    return lo[1] + slope * (n - lo[0])


def snapshot_limit_n() -> int:
    """The first cluster size whose snapshot exceeds the daemon's MAX_PAYLOAD."""
    lo, hi = 1, 2
    while snapshot_bytes(hi) <= MAX_PAYLOAD:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if snapshot_bytes(mid) <= MAX_PAYLOAD else (lo, mid)
    return hi


def _cluster(n: int, seed: int) -> tuple[Scheduler, Negotiator, FakeClock]:
    """The real scheduler holding ``n`` active nodes on the testbed's topology, with values
    as a live cluster has them: nodes that joined over time, workers on ephemeral ports, and
    links probed at their own times (RTT and bandwidth to three digits, as the scheduler
    keeps them)."""
    rng = random.Random(seed)
    clock = FakeClock()
    sched = Scheduler("n1", 1, None, clock)
    for i in range(1, n + 1):
        clock.advance(rng.uniform(0.5, 5.0))
        host = f"10.{10 + i // 65536}.{i // 256 % 256}.{i % 256}"
        sched.set_node(f"n{i}", state="active", addr=host,
                       data_addr=f"{host}:{rng.randint(32768, 60999)}", incarnation=1)
    for a, b in random_links(n, rng, 3):
        clock.advance(rng.uniform(0.0, 0.5))
        sched.links.append(probed_link(a, b, rng, sched.now_ms()))
    return sched, Negotiator(sched, clock, lambda _node: 0), clock


def probed_link(a: str, b: str, rng: random.Random, at: float,
                bandwidth_mbps: float | None = None) -> LinkRecord:
    """An up link as the scheduler keeps it once its ends have probed it at ``at``: an RTT
    drawn from :data:`PROBE_RTT_MS` and ``bandwidth_mbps`` (drawn from 100-1000 if not given),
    each to three digits (:func:`~daemon.cluster.primitives.measured`)."""
    ka, kb = sorted((a, b))
    rtt = measured(rng.uniform(*PROBE_RTT_MS))
    bw = measured(rng.uniform(100, 1000) if bandwidth_mbps is None else bandwidth_mbps)
    return LinkRecord(a=ka, b=kb, state="up", rtt_ms=rtt, bandwidth_mbps=bw, measured_at=at)


def stamped(snap: ClusterState, wall: float, step: int, rng: random.Random) -> ClusterState:
    """``snap`` with the per-node stamps the agent adds before it publishes
    (``ChaosNode._stamped``): each node's step (``step`` or one behind) and its last
    heartbeat, up to 0.5 s (one 2 Hz period) before ``wall``, to the millisecond."""
    nodes = {node: dataclasses.replace(rec, step=step - rng.randint(0, 1),
                                       heard_at=round(wall - rng.uniform(0.0, 0.5), 3))
             for node, rec in snap.nodes.items()}
    return dataclasses.replace(snap, nodes=nodes, step=step)


def wire_bytes(snap: ClusterState) -> int:
    """The snapshot's size on the wire, packed as ``messages.encode`` sends it (computed
    with ``encode_state``, which, unlike ``encode``, does not refuse one past MAX_PAYLOAD)."""
    return len(encode_state(snap))


def full_snapshot(n: int, seed: int = 1) -> ClusterState:
    """The real scheduler's snapshot of ``n`` active nodes as the agent publishes it: the
    policy history full (the last POLICY_KEEP policies, the newest nodes joining one per
    policy), each node stamped with its step and last heartbeat."""
    sched, neg, clock = _cluster(n, seed)
    rng = random.Random(seed + 1)
    late = [f"n{i}" for i in range(max(2, n - POLICY_KEEP + 2), n + 1)]
    for node in late:
        sched.set_node(node, state="standby")
    neg.publish_policy(effective_step=0)
    for k, node in enumerate(late, start=1):
        clock.advance(rng.uniform(1.0, 10.0))
        sched.set_node(node, state="active")
        neg.publish_policy(effective_step=10 * k)
    return stamped(sched.snapshot(), clock.wall(), 100_000, rng)


def plain_bytes(snap: ClusterState) -> int:
    """Its size in the plain (v1) JSON that the daemon sent before it packed the snapshot:
    computed here, since encode refuses a payload past MAX_PAYLOAD and how far past is the
    answer wanted."""
    body = {"v": PROTOCOL_VERSION, "kind": snap.KIND, **dataclasses.asdict(snap)}
    return len(json.dumps(body, separators=(",", ":"), allow_nan=False).encode())


def measure_snapshot(n: int, seed: int = 1, packed: bool = True) -> int:
    """Encoded size of the real scheduler's snapshot of ``n`` active nodes
    (:func:`full_snapshot`), packed as the daemon sends it, or in the plain form."""
    snap = full_snapshot(n, seed)
    return wire_bytes(snap) if packed else plain_bytes(snap)


def policy_cpu_s(n: int, tries: int = 3) -> float:
    """CPU seconds of one real policy step (spanning tree and centre over ``n`` members), the
    least of ``tries``: what every membership change costs the scheduler's event loop.
    Measured on this machine, so it is the one figure of the run that a seed does not fix."""
    _, neg, _ = _cluster(n, 1)
    best = float("inf")
    for _ in range(tries):
        t0 = time.process_time()
        neg.publish_policy(effective_step=0)
        best = min(best, time.process_time() - t0)
    return best
