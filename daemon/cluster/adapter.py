"""The scheduler's side of the policy controller: measurements in, a policy switch out.

The :class:`~daemon.cluster.controller.Controller` is pure; this object feeds it what the
scheduler knows (each member's compute and vector size from its heartbeats, the policy's tree
and the probes' link rates), and carries out its decisions: the next policy, effective a lead
ahead like any planned change, in the new wire format, and a ``policy-changed`` event that
says what was predicted and, for the policy it leaves, what was measured under it.

Only the wire format switches in this release: a worker cannot yet change its sync mode or H
mid-run (``chaos_edge.trainer.replica``), so those candidates are ruled out with that reason.
"""

from __future__ import annotations

from collections import deque

from daemon.cluster.controller import Candidate, Controller, Decision, Hop, Measured
from daemon.cluster.primitives import Negotiator
from daemon.cluster.scheduler import Scheduler
from daemon.contracts.clock import Clock
from daemon.contracts.config import AdaptiveConfig, TrainingConfig
from daemon.contracts.messages import Heartbeat
from daemon.contracts.policy import SyncPolicy

#: Seconds between two measurements given to the controller.
OBSERVE_EVERY_S = 2.0


def running(policy: SyncPolicy) -> Candidate:
    """The candidate a policy in force is."""
    sync = policy.sync
    return Candidate(sync.mode, policy.wire, sync.inner_steps if sync.diloco else 1,
                     sync.fragments, sync.overlap)


def tree_depth(policy: SyncPolicy) -> int:
    """Hops from the policy's root to its deepest member."""
    near: dict[str, list[str]] = {m: [] for m in policy.members}
    for a, b in policy.edges:
        near[a].append(b)
        near[b].append(a)
    depth, seen, todo = 0, {policy.root}, deque([(policy.root, 0)])
    while todo:
        node, d = todo.popleft()
        depth = max(depth, d)
        for peer in near.get(node, []):
            if peer not in seen:
                seen.add(peer)
                todo.append((peer, d + 1))
    return depth


class Adapter:
    """Owns the controller of one scheduler term, and what it measures for it."""

    def __init__(self, sched: Scheduler, neg: Negotiator, cfg: AdaptiveConfig,
                 training: TrainingConfig, clock: Clock) -> None:
        self.sched, self.neg, self.clock = sched, neg, clock
        self.ctl = Controller(cfg, training, clock, cannot=self._cannot)
        inherited = sched.policy
        if inherited is not None and inherited.members and \
                running(inherited) in self.ctl.candidates():
            # A new scheduler goes on under the policy in force, not its own [training]: a
            # failover must not switch the cluster back.
            self.ctl.current = running(inherited)
            neg.wire = inherited.wire
        self.compute_s: dict[str, float] = {}
        self.elements: dict[str, int] = {}
        self._observed_at: float | None = None
        self._last: Decision | None = None  # the decision in force (None: the start)

    def _cannot(self, c: Candidate) -> str | None:
        cur = self.ctl.current
        if (c.sync, c.inner_steps, c.fragments, c.overlap) != (
                cur.sync, cur.inner_steps, cur.fragments, cur.overlap):
            return "a worker cannot change its sync mode or H during a run yet"
        return None

    def heard(self, hb: Heartbeat) -> None:
        """A heartbeat: its worker's compute per step and vector size, when it says them."""
        if hb.compute_ms >= 0 and hb.elements > 0:
            self.compute_s[hb.node] = hb.compute_ms / 1000.0
            self.elements[hb.node] = hb.elements

    def measured(self) -> Measured | None:
        """What the controller needs, once every member and every tree link is measured."""
        policy = self.sched.policy
        if policy is None or not policy.members:
            return None
        members = policy.members
        if any(m not in self.compute_s for m in members):
            return None
        rates = {(lk.a, lk.b): lk for lk in self.sched.links if lk.state == "up"}
        hops = []
        for a, b in policy.edges:
            lk = rates.get((a, b)) or rates.get((b, a))
            if lk is None or not lk.bandwidth_mbps:
                return None  # not probed yet: no guess stands in for a rate
            hops.append(Hop(lk.bandwidth_mbps, lk.rtt_ms or 0.0))
        return Measured({m: self.compute_s[m] for m in members}, hops, tree_depth(policy),
                        max(self.elements[m] for m in members))

    def tick(self) -> bool:
        """Every scheduler tick: judge a measurement every OBSERVE_EVERY_S; True when the
        cluster's policy switched (a new policy is published)."""
        now = self.clock.monotonic()
        if self._observed_at is not None and now - self._observed_at < OBSERVE_EVERY_S:
            return False
        self._observed_at = now
        m = self.measured()
        if m is None:
            return False
        decision = self.ctl.observe(m)
        if decision is None:
            return False
        self._switch(decision)
        return True

    def _switch(self, d: Decision) -> None:
        rate = self.neg.step_rate()
        measured_ms = 1000.0 / rate if rate else None
        before = self._last
        self.neg.wire = d.policy.wire
        effective = self.neg.max_step() + self.neg.lead()
        policy = self.neg.publish_policy(effective_step=effective)
        self._last = d
        self.sched.record(
            "policy-changed", policy=d.policy.label(), previous=d.previous.label(),
            wire=d.policy.wire, sync=d.policy.sync, inner_steps=d.policy.inner_steps,
            policy_version=policy.version if policy else None, effective_step=effective,
            predicted_step_ms=round(d.predicted_step_s * 1000, 3),
            # The policy left: its step time as predicted now, as predicted when it was
            # chosen (None: it was the start), and as measured under it: the model's check.
            previous_step_ms=round(d.previous_step_s * 1000, 3),
            previous_chosen_ms=round(before.predicted_step_s * 1000, 3) if before else None,
            previous_measured_ms=round(measured_ms, 3) if measured_ms else None,
            gain=round(d.gain, 4), reason=d.reason(), ruled_out=len(d.ruled_out))
