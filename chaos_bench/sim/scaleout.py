"""One scale-out in simulated time, under each strategy, planned by the real planners.

What runs for real: the planners of :mod:`chaos_edge.replication.planning` (``chaos`` water-fills
the bytes over the new node's neighbours from their probed rates, ``single`` picks the fastest
one, ``multi-source`` (``even``) splits evenly over every node). What is simulated: the
requests (hop by hop, as the testbed's ``GET_VIA`` relays them) and the bytes, over
:class:`~chaos_bench.sim.network.Net`. ``stop-resume`` moves no bytes over the network:
every node writes a checkpoint, the job restarts, the new node reads it and verifies it, at
the disk and restart figures of :class:`Costs` (the testbed's measured phases).

Idle time is the testbed's definition (Fig. 10), in node-seconds over the N existing nodes:
``chaos`` and ``multi-source`` sum every node's busy window (first request to last byte sent
or relayed); ``single`` (EDL+'s barrier) and ``stop-resume`` (every node stops) are N x delay.
"""

from __future__ import annotations

import itertools
from collections.abc import Generator, Sequence
from dataclasses import dataclass
from typing import Any

import simpy

from chaos_bench.sim.network import DEFAULT_CHUNK, Net
from chaos_bench.sim.topology import Instance
from chaos_edge.replication.planning.model import Neighbor, PlanInput
from chaos_edge.replication.planning.planner import make_plan

STRATEGIES = ("chaos", "single", "multi-source", "stop-resume")


@dataclass(frozen=True)
class Costs:
    """Fixed costs that are not the network's, from the testbed's measured phases.

    Attributes:
        plan_s: The new node's decision (probe results in, plan out), per planned strategy.
        connect_s: The new node's work to open one source's connection (handshake, manifest,
            first request). The new node does it one source at a time: in the testbed the
            k-th source's first byte came about k x 5 ms after the start.
        latency_s: One-way delay of every link (veth on one box: tenths of a millisecond).
        disk_write_bps: Checkpoint write with fsync, bytes/s (stop-resume).
        disk_read_bps: Checkpoint read, bytes/s.
        verify_bps: Checksumming the loaded state, bytes/s.
        restart_s: Restarting the job (a Python process importing torch).
        window_bytes: Bytes a replication flow keeps in flight end to end (socket buffers and
            the relays' read-ahead); fitted to the testbed's multi-source busy windows. The
            fetch keeps 0.2 s of a source's observed rate requested ahead (``lead_s``), a
            megabyte or two for relayed sources that share a link; two chunks here.
    """

    plan_s: float = 0.012
    connect_s: float = 0.006
    latency_s: float = 1e-4
    disk_write_bps: float = 600e6
    disk_read_bps: float = 800e6
    verify_bps: float = 900e6
    restart_s: float = 1.6
    window_bytes: int = 2 << 20


@dataclass(frozen=True)
class Outcome:
    """Delay (request to the last byte in place) and cluster idle time, node-seconds."""

    delay_s: float
    idle_s: float
    participants: int


def _neighbours(inst: Instance, nodes: Sequence[str], latency_s: float) -> list[Neighbor]:
    """Planner inputs: a source's rate is its route's slowest probed or physical link."""
    out = []
    for n in nodes:
        path = [inst.new, *inst.routes[n]]
        rates = [inst.probed.get(path[1], inst.rates[_k(path[0], path[1])])]
        rates += [inst.rates[_k(a, b)] for a, b in itertools.pairwise(path[1:])]
        rate = min(rates)
        out.append(Neighbor(n, latency_s * (len(path) - 1), 1.0 / rate))
    return out


def _k(a: str, b: str) -> tuple[str, str]:
    return (a, b) if a < b else (b, a)


def _transfer(env: simpy.Environment, net: Net, inst: Instance, shares: dict[str, int],
              costs: Costs, start_s: float) -> Generator[Any, Any, None]:
    """Every source gets its request (relayed hop by hop), connects and streams its share."""
    yield env.timeout(start_s)
    setup = simpy.Resource(env, capacity=1)  # the new node opens one source at a time
    flows = []
    for src, nbytes in shares.items():
        if nbytes <= 0:
            continue
        path = [inst.new, *inst.routes[src]]
        flows.append(env.process(_one(env, net, path, nbytes, costs, setup)))
    yield env.all_of(flows)


def _one(env: simpy.Environment, net: Net, path: list[str], nbytes: int, costs: Costs,
         setup: simpy.Resource) -> Generator[Any, Any, None]:
    with setup.request() as turn:
        yield turn
        yield env.timeout(costs.connect_s)
    yield net.request(path)
    yield net.flow(path[::-1], nbytes)


def simulate(inst: Instance, strategy: str, segments: Sequence[int], costs: Costs,
             chunk: int = DEFAULT_CHUNK) -> Outcome:
    """Run one strategy on ``inst`` for a state of ``segments`` (tensor sizes, bytes)."""
    total = sum(segments)
    if strategy == "stop-resume":
        delay = (total / costs.disk_write_bps + costs.restart_s + total / costs.disk_read_bps
                 + total / costs.verify_bps)
        return Outcome(delay, inst.size * delay, inst.size)
    if strategy == "multi-source":
        nodes: Sequence[str] = sorted(inst.routes, key=lambda n: int(n[1:]))
        planner, plan_s = "even", 0.0
    else:
        nodes, planner = inst.neighbours, strategy
        plan_s = costs.plan_s if strategy == "chaos" else 0.0
    plan = make_plan(planner, PlanInput.create(_neighbours(inst, nodes, costs.latency_s),
                                               segments))
    shares = {n: plan.bytes_of(n) for n in nodes}
    env = simpy.Environment()
    net = Net(env, inst.rates, costs.latency_s, chunk, costs.window_bytes,
              {(n, inst.new): r for n, r in inst.together.items()})
    done = env.process(_transfer(env, net, inst, shares, costs, plan_s))
    env.run(until=done)
    delay = float(env.now)
    if strategy == "single":
        return Outcome(delay, inst.size * delay, 1)
    busy = {n: b.seconds for n, b in net.busy.items() if n != inst.new}
    return Outcome(delay, sum(busy.values()), sum(1 for s in busy.values() if s > 0))
