"""Which policy the cluster trains under, in one scheduler term: the controller's choice, the
operator's, and what each member can run.

The :class:`~daemon.cluster.controller.Controller` is pure; :class:`Adapter` feeds it what the
scheduler knows (each member's compute and vector size from its heartbeats, the policy's tree
and the probes' link rates) when ``[adaptive]`` is on, takes the operator's ``chaosctl policy
set|auto``, and carries out each switch: the next policy, effective a lead ahead like any
planned change, in the new wire format and sync mode, and a ``policy-changed`` event that says
what was predicted and, for the policy it leaves, what was measured under it.

A switch of the sync mode or of H takes effect at the first round of the mode in force at or
after the policy's effective step, on every member at once (``chaos_edge.trainer.rhythm``).
A member that cannot run DiLoCo's local steps (the DDP path, a GradScaler) says so in its
heartbeats; the cluster is then never switched into a diloco mode, and the event or the
operator's error says why.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any

from daemon.cluster.controller import Candidate, Controller, Decision, Hop, Measured
from daemon.cluster.primitives import Negotiator, link_key
from daemon.cluster.scheduler import Scheduler
from daemon.cluster.stragglers import StragglerJudge, Verdict, View
from daemon.contracts.clock import Clock
from daemon.contracts.config import AdaptiveConfig, TrainingConfig
from daemon.contracts.errors import PolicyError
from daemon.contracts.messages import Heartbeat
from daemon.contracts.policy import SYNC_MODES, WIRE_FORMATS, SyncMode, SyncPolicy, depth
from daemon.contracts.protocol import PolicyRequest

#: Seconds between two measurements given to the controller.
OBSERVE_EVERY_S = 2.0
#: Seconds after a straggler is set aside when the cluster's step rate without it is measured
#: from (the change takes effect a lead of steps after the decision) and to.
MEASURE_FROM_S, MEASURE_AFTER_S = 4.0, 10.0
#: The span of the members' said steps a step time is measured over, for the cost model's
#: floors: long beside the heartbeats' lag, short beside a phase of the links.
CALIBRATE_S = 6.0
#: A change of the round's bytes time or the slowest compute that starts that span again.
SPAN_MOVED = 1.5
#: Timed spans kept until their links are tested again (the newest; one every
#: OBSERVE_EVERY_S, so a minute's worth at a 60-s bandwidth period).
PENDING_SPANS = 32


@dataclass(frozen=True)
class Aside:
    """A straggler set aside, until its gain is measured."""

    verdict: Verdict
    at: float  # when
    members: int  # members before
    before: float | None  # the cluster's steps a second before
    policy: str  # the policy in force then (its label)
    since: tuple[float, int] | None = None  # (when, the step) the rate after is measured from


def moved(a: float, b: float) -> bool:
    """Whether two readings of one quantity lie SPAN_MOVED or more apart."""
    return max(a, b) > SPAN_MOVED * min(a, b)


def running(policy: SyncPolicy) -> Candidate:
    """The candidate a policy in force is."""
    return running_of(policy.sync, policy.wire)


def tree_depth(policy: SyncPolicy) -> int:
    """Hops from the policy's root to its deepest member."""
    return depth(policy.root, policy.edges)


def sync_mode(c: Candidate, base: SyncMode) -> SyncMode:
    """The sync mode of candidate ``c``, with ``base``'s outer optimizer (and, streaming to
    streaming, its merge weight)."""
    if c.sync == "every-step":
        return SyncMode("every-step", 1, base.outer, base.outer_lr, base.outer_momentum)
    merge = base.merge if c.sync == "streaming" and base.mode == "streaming" else 0.0
    return SyncMode(c.sync, c.inner_steps, base.outer, base.outer_lr, base.outer_momentum,
                    c.fragments, merge, c.overlap)


def requested(body: PolicyRequest, cur: SyncMode, wire: str, training: TrainingConfig
              ) -> tuple[SyncMode, str, set[str]]:
    """The mode and wire ``chaosctl policy set`` asks for, and the parts it pins: what it
    names, the rest as in force (or, entering a diloco mode, as ``[training]`` says).

    Raises:
        PolicyError: A value out of range, or one that does not fit the rest.
    """
    name = body.sync or cur.mode
    if body.wire and body.wire not in WIRE_FORMATS:
        raise PolicyError(f"wire {body.wire!r} is not one of {', '.join(WIRE_FORMATS)}")
    if name not in SYNC_MODES:
        raise PolicyError(f"sync {name!r} is not one of {', '.join(SYNC_MODES)}")
    if name == "every-step" and (body.inner_steps or body.fragments or body.overlap):
        raise PolicyError("every-step sync takes no inner steps, fragments or overlap")
    if name == "diloco" and (body.fragments or body.overlap):
        raise PolicyError("fragments and overlap are streaming's, not diloco's")
    h = body.inner_steps or (cur.inner_steps if cur.diloco else training.inner_steps)
    streaming = cur if cur.mode == "streaming" else training.sync_mode() \
        if training.sync == "streaming" else SyncMode("streaming", fragments=training.fragments)
    parts = body.fragments or streaming.fragments
    overlap = body.overlap == "on" if body.overlap else streaming.overlap
    c = Candidate(name, body.wire or wire, 1 if name == "every-step" else h,
                  parts if name == "streaming" else 1, overlap and name == "streaming")
    mode = sync_mode(c, cur if cur.diloco else training.sync_mode())
    mode.validate()
    pins = {"wire"} if body.wire else set()
    if body.sync or body.inner_steps or body.fragments or body.overlap:
        pins |= {"sync", "inner_steps"}
    return mode, c.wire, pins


class Adapter:
    """Owns the choice of policy for one scheduler term: the controller (None when
    ``[adaptive]`` is off), the operator's pins, and what it measures for them."""

    def __init__(self, sched: Scheduler, neg: Negotiator, cfg: AdaptiveConfig,
                 training: TrainingConfig, clock: Clock) -> None:
        self.sched, self.neg, self.clock, self.training = sched, neg, clock, training
        self.ctl = Controller(cfg, training, clock, cannot=self._cannot) if cfg.enabled \
            else None
        inherited = sched.policy
        if inherited is not None and inherited.members:
            # A new scheduler goes on under the policy in force and its pins, not its own
            # [training]: a failover must not switch the cluster back.
            neg.wire, neg.sync, neg.pinned = inherited.wire, inherited.sync, inherited.pinned
            if self.ctl is not None:
                if inherited.pinned:
                    self.ctl.pin(inherited.pinned, running(inherited))
                elif running(inherited) in self.ctl.candidates():
                    self.ctl.current = running(inherited)
        self.compute_s: dict[str, float] = {}
        self.elements: dict[str, int] = {}
        # Why a member's worker cannot run DiLoCo's local steps (its heartbeats say it).
        self.cannot_diloco: dict[str, str] = {}
        self._observed_at: float | None = None
        self._last: Decision | None = None  # the decision in force (None: the start)
        # One cost model for both: the floors the controller learns serve the judge too.
        self.judge = StragglerJudge(cfg, clock, self.ctl.model) if self.ctl is not None \
            else None
        # Where the judge's streak began (its leader, when, the cluster's step): the step
        # rate "before" a set-aside is measured from there, after the member turned slow, not
        # over a window that may reach back to before it did. Steps as the members said them:
        # extrapolated ones overshoot when a member slows down (a rate below zero, once).
        self._mark: tuple[str | None, float, int] = (None, 0.0, 0)
        self._aside: Aside | None = None  # the last straggler set aside, until measured
        # (when, the members' said step, the policy version, the round's bytes time and the
        # slowest compute) at each observation: the step time under the policy in force,
        # once it spans CALIBRATE_S of it alone.
        self._steps: deque[tuple[float, int, int, float, float]] = deque()
        # Spans timed, waiting for a newer test of their links (:meth:`_confirm`).
        self._pending: list[tuple[Candidate, Measured, float]] = []

    def _cannot(self, c: Candidate) -> str | None:
        if c.sync == "every-step":
            return None
        members = self.sched.policy.members if self.sched.policy else ()
        return self.blocker(members)

    def blocker(self, members: Iterable[str]) -> str | None:
        """Why the cluster cannot enter a diloco mode: the first member that cannot."""
        for node in sorted(members):
            why = self.cannot_diloco.get(node)
            if why:
                return f"{node} cannot: {why}"
        return None

    def heard(self, hb: Heartbeat) -> None:
        """A heartbeat: its worker's compute per step and vector size, when it says them."""
        if hb.compute_ms >= 0 and hb.elements > 0:
            self.compute_s[hb.node] = hb.compute_ms / 1000.0
            self.elements[hb.node] = hb.elements
            self.cannot_diloco[hb.node] = hb.cannot_diloco

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
            hops.append(Hop(lk.bandwidth_mbps, lk.rtt_ms or 0.0,
                            self.neg.bw_readings.get(link_key(a, b), 0)))
        return Measured({m: self.compute_s[m] for m in members}, hops, tree_depth(policy),
                        max(self.elements[m] for m in members))

    def view(self) -> View | None:
        """What the straggler judge needs: the members' and the set-aside nodes' compute, and
        every measured link up between them (None: a member not measured yet)."""
        policy = self.sched.policy
        if policy is None or not policy.members or any(
                m not in self.compute_s for m in policy.members):
            return None
        nodes = set(policy.members) | set(self.neg.benched)
        up = [lk for lk in self.sched.links
              if lk.state == "up" and lk.bandwidth_mbps and lk.a in nodes and lk.b in nodes]
        # A link whose RTT is not known yet (new, its report due within 5 s) is taken at the
        # others' median, not at 0: free, it made a tree without a member look faster (the
        # testbed: a member set aside for a link of 17.8 ms beside one counted 0).
        known = sorted(lk.rtt_ms for lk in up if lk.rtt_ms is not None)
        typical = known[len(known) // 2] if known else 0.0
        links = {(lk.a, lk.b): (lk.bandwidth_mbps or 0.0,
                                typical if lk.rtt_ms is None else lk.rtt_ms) for lk in up}
        return View(policy.members, {n: self.compute_s[n] for n in nodes if n in self.compute_s},
                    links, max(self.elements[m] for m in policy.members), running(policy),
                    dict(self.neg.bw_readings))

    def _stragglers(self) -> bool:
        """Judge the stragglers; True when a policy was published (one set aside)."""
        judge = self.judge
        if judge is None:
            return False
        for node in list(judge.aside):
            if node not in self.neg.benched:
                judge.forget(node)  # back by another way (its worker restarted, a failure)
        self._measure_aside()
        v = self.view()
        verdict = judge.observe(v) if v is not None else None
        now, step = self.clock.monotonic(), self._said_step()
        mark, self._mark = self._mark, (self._mark if judge.leader == self._mark[0]
                                        else (judge.leader, now, step))
        if verdict is None:
            return False
        detail: dict[str, Any] = {
            "action": verdict.action, "node": verdict.node, "cause": verdict.cause,
            "predicted_gain": round(verdict.gain, 4) if verdict.gain < 1e9 else None,
            "predicted_step_ms_with": round(verdict.step_s_with * 1000, 3)
            if verdict.step_s_with < 1e9 else None,
            "predicted_step_ms_without": round(verdict.step_s_without * 1000, 3)
            if verdict.step_s_without < 1e9 else None,
            "reason": verdict.reason()}
        if v is not None:  # what its links read, so an operator sees which one and why
            detail["links"] = {(b if a == verdict.node else a): {"mbps": mbps, "rtt_ms": rtt}
                               for (a, b), (mbps, rtt) in sorted(v.links.items())
                               if verdict.node in (a, b)}
        if verdict.action == "rejoin":
            if self._aside is not None and self._aside.verdict.node == verdict.node:
                self._aside = None  # back before its gain could be measured
            self.neg.let_back(verdict.node)
            self.sched.record("straggler", **detail)
            return False
        _, t0, s0 = mark
        rate = (step - s0) / (now - t0) if mark[0] == verdict.node and now > t0 else None
        if self.neg.stand_aside(verdict.node, verdict.reason()) is None:
            judge.forget(verdict.node)  # a join in flight, or too few would stay
            return False
        self._aside = Aside(verdict, now, len(v.members) if v else 0, rate,
                            label(self.neg.sync, self.neg.wire))
        self.sched.record("straggler", **detail,
                          steps_per_s_before=round(rate, 3) if rate else None)
        return True

    def _measure_aside(self) -> None:
        """MEASURE_AFTER_S after a straggler was set aside: the gain as measured (samples a
        second, a member's batch each, from the cluster's step rate) beside the predicted,
        and whether the policy switched meanwhile (then the two rates ran under different
        policies, and the gain is not the set-aside's alone)."""
        a, now = self._aside, self.clock.monotonic()
        if a is None or now - a.at < MEASURE_FROM_S:
            return
        if a.since is None:
            self._aside = replace(a, since=(now, self._said_step()))
            return
        if now - a.at < MEASURE_AFTER_S:
            return
        self._aside = None
        t0, s0 = a.since
        after = (self._said_step() - s0) / (now - t0) if now > t0 else None
        before, members = a.before, a.members
        measured = ((members - 1) * after) / (members * before) - 1.0 \
            if before and after is not None and members > 1 else None
        self.sched.record("straggler", action="measured", node=a.verdict.node,
                          cause=a.verdict.cause, predicted_gain=round(a.verdict.gain, 4),
                          measured_gain=round(measured, 4) if measured is not None else None,
                          steps_per_s_before=round(before, 3) if before else None,
                          steps_per_s_after=round(after, 3) if after is not None else None,
                          policy_switched=label(self.neg.sync, self.neg.wire) != a.policy)

    def _said_step(self) -> int:
        """The newest step a member said it holds (its heartbeat), not extrapolated."""
        policy = self.sched.policy
        return max((self.neg.reported(m) for m in policy.members), default=0) if policy \
            else 0

    def tick(self) -> bool:
        """Every scheduler tick: judge a measurement every OBSERVE_EVERY_S; True when the
        cluster's policy changed (a new policy is published)."""
        now = self.clock.monotonic()
        if self.ctl is None or (self._observed_at is not None
                                and now - self._observed_at < OBSERVE_EVERY_S):
            return False
        self._observed_at = now
        if self._stragglers():
            return True
        m = self.measured()
        if m is None:
            return False
        self._calibrate(m, now)
        self._confirm(m)
        decision = self.ctl.observe(m)
        if decision is None:
            return False
        self._switch(sync_mode(decision.policy, self.neg.sync if self.neg.sync.diloco
                               else self.training.sync_mode()), decision.policy.wire,
                     decision.policy.label(), decision.previous.label(), decision.reason(),
                     predicted_step_ms=round(decision.predicted_step_s * 1000, 3),
                     previous_step_ms=round(decision.previous_step_s * 1000, 3),
                     gain=round(decision.gain, 4), ruled_out=len(decision.ruled_out),
                     floors_ns=self.ctl.model.floors(), **self._check())
        self._last = decision
        return True

    def _calibrate(self, m: Measured, now: float) -> None:
        """Give the cost model the step time measured under the policy in force, over the
        last CALIBRATE_S of it: every sample taken under this policy version, at or after
        the step it took effect at (a switch, a join or a set-aside starts the span again)."""
        policy = self.sched.policy
        if policy is None or self.ctl is None:
            return
        c = running(policy)
        if c.sync != "every-step" or not m.hops or not m.compute_s:
            self._steps.clear()  # the model learns from every-step rounds only
            return
        said = (now, self._said_step(), policy.version, self.ctl.model.bytes_s(c, m),
                max(m.compute_s.values()))
        if self._steps and (moved(self._steps[0][3], said[3])
                            or moved(self._steps[0][4], said[4])):
            # A span that straddles a change of the links or the compute averages two
            # regimes: read against the new one it would teach a floor (or a cap) of neither.
            self._steps.clear()
        self._steps.append(said)
        while self._steps and (self._steps[0][2] != policy.version
                               or self._steps[0][1] < policy.effective_step
                               or now - self._steps[0][0] > CALIBRATE_S):
            self._steps.popleft()
        if not self._steps:
            return
        (t0, s0, *_), (t1, s1, *_) = self._steps[0], self._steps[-1]
        if t1 - t0 >= CALIBRATE_S - OBSERVE_EVERY_S / 2 and s1 > s0:
            self._pending.append((c, m, (t1 - t0) / (s1 - s0)))

    def _confirm(self, now: Measured) -> None:
        """Teach the model the spans whose links a newer test read at the same rates.

        A probe reads a link's change late (a test every ``bandwidth_period_s``): slow rounds
        timed under the old, fast reading would pass for a floor. So a span waits until every
        hop of its tree was tested again, and is dropped if a new test moved a rate by
        SPAN_MOVED or the tree changed."""
        assert self.ctl is not None
        kept = []
        for c, m, step_s in self._pending:
            if len(m.hops) != len(now.hops):
                continue  # another tree: the span cannot be confirmed
            pairs = list(zip(m.hops, now.hops, strict=True))
            if any(b.reading > a.reading and moved(a.rate_mbps, b.rate_mbps)
                   for a, b in pairs):
                continue
            if all(b.reading > a.reading for a, b in pairs):
                self.ctl.model.calibrate(c, m, step_s)
            else:
                kept.append((c, m, step_s))
        self._pending = kept[-PENDING_SPANS:]

    def request(self, body: PolicyRequest) -> str | None:
        """``chaosctl policy set|auto`` from an operator; an error line, or None."""
        if body.auto:
            if self.ctl is None:
                return "the policy controller is off ([adaptive] enabled = false)"
            self.ctl.release()
            self.neg.pinned = ()
            self.neg.publish_policy(effective_step=self.neg.max_step() + self.neg.lead())
            return None
        try:
            mode, wire, pins = requested(body, self.neg.sync, self.neg.wire, self.training)
        except PolicyError as exc:
            return str(exc)
        policy = self.sched.policy
        if mode.diloco and policy is not None:
            why = self.blocker(policy.members)
            if why:
                return f"the cluster cannot run {mode.mode}: {why}"
        was = label(self.neg.sync, self.neg.wire)
        now = label(mode, wire)
        if self.ctl is not None:
            self.ctl.pin(pins, running_of(mode, wire))
        self.neg.pinned = tuple(sorted(set(self.neg.pinned) | pins))
        self._switch(mode, wire, now, was, f"set by the operator (chaosctl policy set): {now}")
        self._last = None
        return None

    def _check(self) -> dict[str, Any]:
        """The policy left, as predicted when it was chosen (None: configured or set by the
        operator) and as measured under it: the model's check."""
        rate = self.neg.step_rate()
        before = self._last
        return {"previous_chosen_ms": round(before.predicted_step_s * 1000, 3) if before
                else None,
                "previous_measured_ms": round(1000.0 / rate, 3) if rate else None}

    def _switch(self, mode: SyncMode, wire: str, now: str, was: str, reason: str,
                **detail: Any) -> None:
        self.neg.wire, self.neg.sync = wire, mode
        effective = self.neg.max_step() + self.neg.lead()
        policy = self.neg.publish_policy(effective_step=effective)
        self.sched.record(
            "policy-changed", policy=now, previous=was, wire=wire, sync=mode.mode,
            inner_steps=mode.inner_steps, fragments=mode.fragments,
            policy_version=policy.version if policy else None, effective_step=effective,
            reason=reason, **detail)


def running_of(mode: SyncMode, wire: str) -> Candidate:
    """The candidate of a sync mode and wire."""
    return Candidate(mode.mode, wire, mode.inner_steps if mode.diloco else 1, mode.fragments,
                     mode.overlap)


def label(mode: SyncMode, wire: str) -> str:
    """How events name a policy (:meth:`Candidate.label`)."""
    return running_of(mode, wire).label()
