"""Stragglers: a member without which the cluster trains more samples a second.

Synchronous data parallelism waits for the slowest member's compute, and the pipelined
all-reduce for the slowest link of the tree. One box throttled by heat, or moved to a slow
Wi-Fi link, can make the whole cluster slower than it would be without that box. The judge
predicts, with the controller's :class:`~daemon.cluster.controller.CostModel` and the policy in
force, the cluster's samples a second (members over the step time, each member's batch being
its own) with every member, and without each one in turn, over the widest tree the measured
links allow. The remedies, cheapest first:

1. *A smaller batch share*: in consistent mode every round splits the fixed global batch by the
   members' measured speeds (samples a second), so a box slow per sample computes its
   smaller share in about the time the rest take. Its compute, as its heartbeats report it,
   is then level with theirs, and the judge finds no straggler: the remedy is already in
   force. A cost a step that shares cannot shrink (a fixed stall) is left to the next ones.
2. *A different place in the tree*: the scheduler republishes the widest tree when the
   measured links make it clearly wider than the one in force (``Negotiator._improve_policy``);
   the judge compares the cluster with and without a member over the widest tree, so a
   member whose links a better tree avoids is no straggler.
3. *Set aside* (a scale-in with a reason): when the cluster without the member is predicted to
   train more samples a second, by more than ``[adaptive] hysteresis``, in ``dwell``
   measurements in a row and ``min_interval_s`` after the judge last acted. Its worker waits to
   rejoin, holding its state, and the scheduler holds its join while it is aside.

A member set aside for its links rejoins when the probes (which go on while it is aside) say
that the cluster with it, at its last measured compute, would train more samples a second. One
set aside for its compute cannot be measured while it waits, so it is tried again after
``straggler_retry_s``, twice as long each time it was set aside within the last hour (at most
4x): if it is still slow, it is set aside again once measured. The remedy DiLoCo-style local
steps for one member only (it joins the outer rounds alone) is not offered: every member holds
the same state at every step, which a member on its own rhythm would not.

Pure logic, as the controller is: measurements and a clock in, :class:`Verdict` out.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from daemon.cluster.controller import Candidate, CostModel, Hop, Measured
from daemon.contracts.clock import Clock
from daemon.contracts.config import AdaptiveConfig
from daemon.contracts.policy import depth, spanning_tree

Link = tuple[str, str]
#: How long a set-aside counts towards the next one's longer wait.
REPEAT_WINDOW_S = 3600.0
#: The longest wait before a trial, in multiples of ``straggler_retry_s``.
RETRY_FACTOR_MAX = 4
#: Seconds a member is watched before it may be set aside: its compute, as its heartbeats say
#: it, is a moving average over its last steps, so one back for a trial still reads as slow
#: as it was until it has trained a while.
SETTLE_S = 10.0


@dataclass(frozen=True)
class View:
    """What the scheduler measured of the members and of the nodes set aside."""

    members: tuple[str, ...]
    compute_s: Mapping[str, float]  # seconds of compute a step, per node (aside: the last)
    links: Mapping[Link, tuple[float, float]]  # link up -> (Mbit/s, RTT ms); measured only
    elements: int  # elements of the round layout
    policy: Candidate  # the policy in force
    readings: Mapping[Link, int] = field(default_factory=dict)  # bandwidth tests per link


@dataclass(frozen=True)
class Verdict:
    """A member to set aside, or a node set aside to let back in, and why."""

    action: str  # "set-aside" | "rejoin"
    node: str
    cause: str  # "compute" | "link" (set-aside); "links-recovered" | "trial" | "too-few" (rejoin)
    gain: float  # predicted: samples a second after / before, minus 1
    step_s_with: float  # predicted step time with the node
    step_s_without: float  # and without it

    def reason(self) -> str:
        if self.action == "set-aside":
            return (f"{self.node}'s {self.cause} slows the cluster: {self.step_s_with * 1000:.0f}"
                    f" ms a step with it, {self.step_s_without * 1000:.0f} ms without, "
                    f"{self.gain:+.0%} samples a second without it")
        why = {"links-recovered": "its links recovered",
               "trial": "a trial: its compute is measured again",
               "too-few": "too few members train without it"}[self.cause]
        return (f"{self.node} rejoins: {why} ({self.gain:+.0%} samples a second predicted "
                f"with it)")


@dataclass
class Aside:
    """A node the judge set aside."""

    cause: str
    since: float
    retry_at: float
    readings: dict[Link, int]


class StragglerJudge:
    """Finds the member the cluster is better off without, and when to let it back in."""

    def __init__(self, cfg: AdaptiveConfig, clock: Clock, model: CostModel | None = None,
                 settle_s: float = SETTLE_S) -> None:
        self.cfg, self.clock, self.settle_s = cfg, clock, settle_s
        self.model = model or CostModel()
        self._since: dict[str, float] = {}  # member -> since when the judge has seen it one
        self.aside: dict[str, Aside] = {}
        self._history: dict[str, list[float]] = {}  # node -> when it was set aside
        self._leader: str | None = None
        self._streak = 0
        # The link tests when the leader's streak began: a member set aside for its links
        # waits until a link of the others' is tested again. When every rate falls at once,
        # the probes see it link by link: one member's links read slow while the others'
        # still read fast (the adaptive bench, seed 10: n3 set aside on 20 Mbit/s links, all
        # of them alike, let back 2 s later).
        self._leader_readings: Mapping[Link, int] = {}
        self._acted_at: float | None = None

    def step_s(self, nodes: Iterable[str], v: View) -> float:
        """Predicted step time of a cluster of ``nodes`` (inf: their links do not join them,
        or one of them has no measured compute)."""
        group = sorted(set(nodes))
        if not group or any(n not in v.compute_s for n in group):
            return math.inf
        compute = {n: v.compute_s[n] for n in group}
        if len(group) == 1:
            return self.model.step_s(v.policy, Measured(compute, (), 0, v.elements))
        plan = spanning_tree(group, {k: rate for k, (rate, _rtt) in v.links.items()})
        if not plan.connected:
            return math.inf
        hops = []
        for a, b in plan.edges:
            rate, rtt = v.links.get((a, b)) or v.links[(b, a)]
            hops.append(Hop(rate, rtt))
        m = Measured(compute, hops, depth(plan.root, plan.edges), v.elements)
        return self.model.step_s(v.policy, m)

    def samples_rate(self, nodes: Iterable[str], v: View) -> float:
        """Samples a second of a cluster of ``nodes``, in member-batches (0: it cannot run)."""
        group = set(nodes)
        step = self.step_s(group, v)
        return len(group) / step if math.isfinite(step) and step > 0 else 0.0

    def observe(self, v: View) -> Verdict | None:
        """Judge one measurement: a node to let back in first, else a member to set aside."""
        now = self.clock.monotonic()
        self._since = {m: self._since.get(m, now) for m in v.members}
        for node in sorted(self.aside):
            back = self._back(node, v, now)
            if back is not None:
                del self.aside[node]
                self._acted_at = now
                self._leader, self._streak = None, 0
                return back
        if not self.cfg.stragglers or len(v.members) < 3:
            self._leader, self._streak = None, 0
            return None
        verdict = self._worst(v, now)
        if verdict is None or verdict.gain <= self.cfg.hysteresis:
            self._leader, self._streak = None, 0
            return None
        if verdict.node != self._leader:
            self._leader, self._streak, self._leader_readings = verdict.node, 0, v.readings
        self._streak += 1
        if self._streak < self.cfg.dwell or (
                self._acted_at is not None and now - self._acted_at < self.cfg.min_interval_s):
            return None
        if verdict.cause == "link" and not self._others_retested(verdict.node, v):
            return None
        self._leader, self._streak, self._acted_at = None, 0, now
        history = [t for t in self._history.get(verdict.node, []) if now - t < REPEAT_WINDOW_S]
        self._history[verdict.node] = [*history, now]
        wait = self.cfg.straggler_retry_s * min(2 ** len(history), RETRY_FACTOR_MAX)
        mine = {k: n for k, n in v.readings.items() if verdict.node in k}
        self.aside[verdict.node] = Aside(verdict.cause, now, now + wait, mine)
        return verdict

    @property
    def leader(self) -> str | None:
        """The member a streak of measurements finds the cluster better off without."""
        return self._leader

    def _others_retested(self, node: str, v: View) -> bool:
        """Whether a link between other members was tested since the streak began (True
        when there is none to test)."""
        others = [k for k in v.links if node not in k]
        return not others or any(v.readings.get(k, 0) > self._leader_readings.get(k, 0)
                                 for k in others)

    def forget(self, node: str) -> None:
        """``node`` is back by another way (the operator, a restart): no longer aside."""
        self.aside.pop(node, None)

    def _worst(self, v: View, now: float) -> Verdict | None:
        """The member whose absence gains the most samples a second (None: none measured).

        Each member alone, and the slowest ones together (two boxes equally throttled: either
        alone gains nothing while the other still holds every step back); the slowest of the
        best group goes first, the next at a later measurement."""
        members = set(v.members)
        base = self.samples_rate(members, v)
        if base <= 0:
            return None
        slowest = sorted(members, key=lambda n: (-v.compute_s[n], n))
        groups = [[n] for n in sorted(members)] + [slowest[:k] for k in range(2, len(members) - 1)]
        best: Verdict | None = None
        for group in groups:
            if any(now - self._since[n] < self.settle_s for n in group):
                continue
            rest = members - set(group)
            gain = self.samples_rate(rest, v) / base - 1.0
            if best is not None and gain <= best.gain:
                continue
            node = group[0]
            best = Verdict("set-aside", node, self._cause(group, v, base), gain,
                           self.step_s(members, v), self.step_s(rest, v))
        return best

    def _cause(self, group: list[str], v: View, base: float) -> str:
        """"compute" when the group, at the others' slowest compute, would be no straggler,
        else "link"."""
        others = [v.compute_s[m] for m in v.members if m not in group]
        top = max(others, default=0.0)
        level = {**v.compute_s, **{n: min(v.compute_s[n], top) for n in group}}
        fixed = self.samples_rate(v.members, View(v.members, level, v.links, v.elements,
                                                  v.policy))
        rest = self.samples_rate(set(v.members) - set(group), v)
        return "compute" if fixed > 0 and rest <= fixed * (1.0 + self.cfg.hysteresis) \
            and fixed > base else "link"

    def _back(self, node: str, v: View, now: float) -> Verdict | None:
        """Whether ``node``, set aside, rejoins now."""
        a = self.aside[node]
        members = set(v.members) - {node}
        without = self.samples_rate(members, v)
        with_it = self.samples_rate(members | {node}, v)
        gain = with_it / without - 1.0 if without > 0 else math.inf
        steps = (self.step_s(members | {node}, v), self.step_s(members, v))
        if len(members) < 2:
            return Verdict("rejoin", node, "too-few", gain, *steps)
        newer = any(n > a.readings.get(k, 0) for k, n in v.readings.items() if node in k)
        if a.cause == "link" and newer and gain > 0:
            return Verdict("rejoin", node, "links-recovered", gain, *steps)
        if now >= a.retry_at:
            return Verdict("rejoin", node, "trial", gain, *steps)
        return None
