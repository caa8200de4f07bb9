"""Poisson joins, leaves and failures, decided by the real scheduler, in simulated time.

The scheduler is the daemon's own :class:`~daemon.cluster.scheduler.Scheduler` and
:class:`~daemon.cluster.primitives.Negotiator` on a clock read from the simulation: a join
request gets neighbours, links, a version step and a policy from it, exactly as in a chaosd.
Broker traffic follows the protocol: each request and its reply (a joining node's probe
figures for its new links among them), the commands the negotiator queues, the retained
presence of a node that comes or goes (to every node), and the retained snapshot it would
publish (to every node), at the size the daemon sends it: the scheduler's snapshot with the
agent's per-node stamps, packed (:func:`~chaos_bench.sim.broker.stamped`,
:func:`~chaos_bench.sim.broker.wire_bytes`). Its links carry probe figures, as a running
cluster's do (:func:`~chaos_bench.sim.broker.probed_link`); those and the stamps are drawn
from a random stream of their own, so the churn's events do not depend on them.

Training advances one step every ``step_s``. The sources serve once the cluster has committed
the version step; the transfer is the ``chaos`` strategy over the new node's three links
(:func:`~chaos_bench.sim.scaleout.simulate`); the ``replicated`` report closes the join, so
the ``scale-out`` events and their ``delay_ms`` are the real scheduler's. A failure is declared
after the phi-accrual detection time of :mod:`chaos_bench.sim.failover`; a leave takes
effect at once.

Every membership change costs the real policy step (a spanning tree and a tree centre over
every member, about N log N since issue 12) and the snapshot's packing, in CPU on this machine:
that CPU is not charged to simulated time (about 0.06 s per change at 1,000 members, against
scale-outs of about 2 s), and it bounds how large a cluster this runs in reasonable time
(:data:`chaos_bench.sim.run.CHURN_MAX_NODES`: 600 simulated s at 1,000 nodes take about
30 CPU-s).
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Generator
from dataclasses import asdict, dataclass
from typing import Any

import simpy

from chaos_bench.models import tensor_sizes
from chaos_bench.sim.broker import (
    HB_BYTES,
    PROBE_RTT_MS,
    BrokerModel,
    heartbeat_load,
    probed_link,
    stamped,
    wire_bytes,
)
from chaos_bench.sim.clock import SimClock
from chaos_bench.sim.network import MBIT, key
from chaos_bench.sim.scaleout import Costs, simulate
from chaos_bench.sim.topology import Instance, random_links
from daemon.cluster.primitives import Negotiator
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.kinds import MEMBER_STATES
from daemon.contracts.protocol import JoinRequest, LeaveRequest, LinkMetrics, Replicated

CMD_BYTES = 400  # a term-stamped command (connect, replicate) as the daemon encodes it
STATUS_BYTES = 160  # a presence status, retained


@dataclass(frozen=True)
class ChurnRates:
    """Events per node-hour, each a Poisson process over the whole cluster."""

    join: float = 1.0
    leave: float = 0.5
    fail: float = 0.5


def run(n: int, seed: int, seconds: float, rates: ChurnRates, model: BrokerModel,
        costs: Costs, *, step_s: float = 0.5, detect_s: float = 2.0,
        model_name: str = "resnet101") -> dict[str, Any]:
    """``seconds`` of churn on a cluster that starts with ``n`` active nodes."""
    rng = random.Random(seed * 31 + n)
    probe = random.Random(f"probe-{seed}-{n}")  # probe figures and stamps, apart from rng
    env = simpy.Environment()
    clock = SimClock(env)
    sched = Scheduler("n1", 1, None, clock)
    neg = Negotiator(sched, clock, lambda _node: int(env.now / step_s))
    link_mbps: dict[tuple[str, str], float] = {}
    for i in range(1, n + 1):
        sched.set_node(f"n{i}", state="active", data_addr=f"n{i}:7000")
    for a, b in random_links(n, rng, 3):
        link_mbps[key(a, b)] = float(round(rng.uniform(100, 1000)))
        sched.links.append(probed_link(a, b, probe, sched.now_ms(), link_mbps[key(a, b)]))
    neg.publish_policy(effective_step=0)
    segments = tensor_sizes(model_name)
    traffic = {"publishes": 0.0, "deliveries": 0.0, "bytes": 0.0}
    counts = {"join": 0, "leave": 0, "fail": 0}
    outcome = {"dropped": 0, "in_flight": 0}
    delays: list[float] = []
    snapshots: list[int] = []  # the size of each snapshot published, bytes
    next_id = [n + 1]

    def publish() -> None:
        """Send what the negotiator queued, and the snapshot if the state changed."""
        out, neg.out = neg.out, []
        traffic["publishes"] += len(out)
        traffic["deliveries"] += len(out)
        traffic["bytes"] += len(out) * CMD_BYTES
        if sched.dirty:
            snap = stamped(sched.snapshot(), clock.wall(), int(env.now / step_s), probe)
            size, live = wire_bytes(snap), len(sched.live())
            snapshots.append(size)
            traffic["publishes"] += 1
            traffic["deliveries"] += live
            traffic["bytes"] += size * live

    def send(copies: int, nbytes: int) -> None:
        traffic["publishes"] += 1
        traffic["deliveries"] += copies
        traffic["bytes"] += copies * nbytes

    def request() -> None:
        """A request on ``sched/req`` to the scheduler (only ``link`` requests are answered)."""
        send(1, CMD_BYTES)

    def presence() -> None:
        """A retained status (up, left, or the last will): every node watches presence."""
        send(len(sched.live()), STATUS_BYTES)

    def members() -> list[str]:
        return neg.members()

    def join() -> Generator[Any, Any, None]:
        node = f"n{next_id[0]}"
        next_id[0] += 1
        outcome["in_flight"] += 1
        pool = [m for m in members() if sched.nodes[m].state == "active"]
        nbrs = sorted(rng.sample(pool, min(3, len(pool))))
        rates = {key(m, node): float(round(rng.uniform(100, 1000))) for m in nbrs}
        presence()
        request()
        neg.handle(node, JoinRequest(addr=f"{node}:7000", neighbors=nbrs))
        publish()
        join = neg.joins.get(node)
        version_step = join.command.version_step if join else 0  # the state's step
        yield env.timeout(max(0.0, (version_step + 1) * step_s - env.now))
        inst = Instance(len(pool), node, tuple(nbrs), {k: r * MBIT for k, r in rates.items()},
                        {m: rates[key(m, node)] * MBIT for m in nbrs}, {m: (m,) for m in nbrs})
        yield env.timeout(simulate(inst, "chaos", segments, costs).delay_s)
        if sched.nodes.get(node) is not None and sched.nodes[node].state == "joining":
            for m in nbrs:  # its probes have measured the new links (no new snapshot alone)
                request()
                neg.handle(node, LinkMetrics(peer=m, rtt_ms=probe.uniform(*PROBE_RTT_MS),
                                             bandwidth_mbps=rates[key(m, node)]))
            request()
            neg.handle(node, Replicated(version=version_step))
            publish()
            # the real scheduler's event (read now: the log keeps only the last 100)
            ev = next(e for e in reversed(sched.events) if e.kind == "scale-out"
                      and e.node == node)
            delays.append((ev.delay_ms or 0.0) / 1000.0)
        else:  # failed (or dropped by the scheduler) while it was joining
            outcome["dropped"] += 1
        outcome["in_flight"] -= 1
        link_mbps.update(rates)

    def leave() -> None:
        pool = [m for m in members() if m != sched.me and sched.nodes[m].state == "active"]
        if pool:
            request()
            neg.handle(rng.choice(pool), LeaveRequest(step=int(env.now / step_s)))
            presence()
            publish()

    def fail() -> Generator[Any, Any, None]:
        pool = [m for m in members() if m != sched.me]
        if not pool:
            return
        node = rng.choice(pool)
        presence()  # the broker fires its last will (kill -9), or nothing (a freeze)
        yield env.timeout(detect_s)
        if sched.nodes[node].state in MEMBER_STATES:
            sched.fail(node, "heartbeat", detect_s)
            neg.gone(node, "failure")
            publish()

    def arrivals(kind: str, per_node_h: float) -> Generator[Any, Any, None]:
        while True:
            rate = per_node_h * max(1, len(members())) / 3600.0
            yield env.timeout(rng.expovariate(rate))
            counts[kind] += 1
            if kind == "join":
                env.process(join())
            elif kind == "leave":
                leave()
            else:
                env.process(fail())

    for kind in ("join", "leave", "fail"):
        env.process(arrivals(kind, getattr(rates, kind)))
    env.run(until=seconds)
    hb_pubs, hb_dels = heartbeat_load(len(members()), "leader-only")
    churn_cpu = model.cost(traffic["publishes"], traffic["deliveries"], traffic["bytes"])
    return {
        "nodes": n, "seconds": seconds, "rates_per_node_h": asdict(rates), "events": counts,
        "members_end": len(members()), "scale_outs": len(delays), **{
            f"joins_{k}": v for k, v in outcome.items()},
        "scale_out_delay_s": {"median": statistics.median(delays) if delays else None,
                              "max": max(delays) if delays else None},
        "snapshots": len(snapshots),
        "snapshot_bytes_max": max(snapshots, default=None),
        "churn_deliveries_per_s": traffic["deliveries"] / seconds,
        "churn_bytes_per_s": traffic["bytes"] / seconds,
        "broker_busy": churn_cpu / seconds + model.cost(hb_pubs, hb_dels, hb_dels * HB_BYTES),
    }
