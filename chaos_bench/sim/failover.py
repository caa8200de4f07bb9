"""The scheduler dies: how long until the followers know and a new one is elected, at N nodes.

Real logic: the followers' :class:`~daemon.cluster.detector.PhiAccrualDetector` on the
scheduler's 2 Hz heartbeats, their :class:`~daemon.cluster.election.Election` (ranking, stagger,
the claim each follower applies) with the daemon's default configs. Simulated (SimPy): the
heartbeats' and the claim's trip through a broker that serves one copy at a time at the
:class:`~chaos_bench.sim.broker.BrokerModel`'s cost, slowed by the heartbeat load of the
subscription pattern (a fraction ``rho`` of the broker's core); the agents' 0.1 s ticks.

Two faults, as in ``chaosctl bench control``: ``kill9`` (the broker sees the socket close and
fires the last will at once) and ``sigstop`` (a silent scheduler: only phi-accrual finds it).
``elected_s`` is fault to the new scheduler's claim, as the control bench measures it (its
``scheduler-elected`` event); ``followed_s`` is fault to the last follower applying the claim.
``settle_s`` is the part of a real failover this model does not cover (the agent's handling
between detection and claim), fitted to the control bench's 12-node medians.
"""

from __future__ import annotations

import random
from collections.abc import Generator
from typing import Any

import simpy

from chaos_bench.sim.broker import HB_BYTES, BrokerModel, heartbeat_load
from chaos_bench.sim.clock import SimClock
from daemon.cluster.detector import PhiAccrualDetector
from daemon.cluster.election import Action, Election
from daemon.contracts.config import DetectorConfig, ElectionConfig

TICK_S = 0.1
CLAIM_BYTES = 120
#: Fitted: control bench (12 nodes, mosquitto) kill9 failover p50 0.555 s, sigstop 1.870 s.
SETTLE_S = {"kill9": 0.485, "sigstop": 0.0}
CANDIDATES = 3  # followers that tick the election in full (the lowest ranks)


def run(n: int, fault: str, pattern: str, model: BrokerModel, seed: int) -> dict[str, Any]:
    """One failover in a cluster of ``n`` nodes; times in seconds from the fault."""
    pubs, dels = heartbeat_load(n, pattern)
    rho = model.cost(pubs, dels, dels * HB_BYTES)
    if rho >= 1.0:
        return {"nodes": n, "fault": fault, "pattern": pattern, "rho": rho, "saturated": True,
                "detect_s": None, "elected_s": None, "followed_s": None}
    rng = random.Random(seed * 7919 + n)
    env = simpy.Environment()
    clock = SimClock(env)
    copy_s = (model.per_delivery_s + HB_BYTES * model.per_byte_s) / (1.0 - rho)
    wait_s = rho * copy_s / 2.0  # M/D/1 mean wait behind the heartbeat load
    dead = "n1"
    names = [f"n{i}" for i in range(2, n + 1)]
    live = set(names)
    elections = {m: Election(m, ElectionConfig(), clock) for m in names}
    ranked = sorted(names)[:CANDIDATES]
    detectors = {m: PhiAccrualDetector(DetectorConfig(), clock) for m in ranked}
    for e in elections.values():
        e.connected()
        e.on_claim(dead, 1)
    fault_at = 30.0 + rng.random() * 0.5
    out: dict[str, Any] = {"nodes": n, "fault": fault, "pattern": pattern, "rho": rho,
                           "saturated": False}

    def fanout(first_s: float, copies: int) -> float:
        """When copy ``i`` of ``copies`` leaves the broker: behind the queue, one at a time."""
        return first_s + wait_s + rng.randrange(copies) * copy_s

    def heartbeats() -> Generator[Any, Any, None]:
        while env.now < fault_at:
            sent = env.now
            for m in ranked:  # each candidate's copy arrives after its place in the fan-out
                env.process(deliver(lambda m=m: detectors[m].heartbeat(dead),
                                    fanout(sent, n - 1) - sent))
            yield env.timeout(0.5)

    def deliver(action: Any, after: float) -> Generator[Any, Any, None]:
        yield env.timeout(max(0.0, after))
        action()

    def claim(winner: str, term: int) -> Generator[Any, Any, None]:
        yield env.timeout(SETTLE_S[fault])
        out["elected_s"] = env.now - fault_at
        start = env.now + wait_s
        last = start
        for i, m in enumerate(sorted(names, key=lambda _m: rng.random())):
            at = start + i * ((model.per_delivery_s + CLAIM_BYTES * model.per_byte_s)
                              / (1.0 - rho))
            last = at
            if m != winner:
                elections[m].on_claim(winner, term)
        yield env.timeout(last - env.now)
        followed = sum(elections[m].leader == winner for m in names)
        out["followed_s"] = env.now - fault_at
        out["followers"] = followed

    def candidate(m: str) -> Generator[Any, Any, None]:
        yield env.timeout(rng.random() * TICK_S)  # the agents' ticks are not aligned
        det, el = detectors[m], elections[m]
        while "elected_s" not in out and "claimed" not in out:
            gone = (fault == "kill9" and env.now >= will_at[m]) or (
                fault == "sigstop" and env.now > fault_at and not det.is_alive(dead))
            if gone and el.leader == dead:
                el.leader_lost()
                out.setdefault("detect_s", env.now - fault_at)
            verdict = el.tick(live - {m} if gone else (live | {dead}) - {m})
            if verdict.action is Action.CLAIM:
                out["claimed"] = m
                env.process(claim(m, verdict.term))
            yield env.timeout(TICK_S)

    will_at = {m: fanout(fault_at, n - 1) for m in ranked}
    env.process(heartbeats())
    for m in ranked:
        env.process(candidate(m))
    env.run(until=fault_at + 120.0)
    out.pop("claimed", None)
    return out
