"""The policy controller: which sync policy the cluster trains under, chosen from what it measured.

Edge links change by orders of magnitude within a day, so no policy fixed before the run is
right for all of it. The controller predicts, for each policy it may choose (sync mode, DiLoCo's
H, wire format), the time to a unit of training progress: the step time from the members'
measured compute and the all-reduce tree's measured links, times the extra steps the policy
needs to reach the same loss (a documented prior). It switches when the best one beats the
policy in force by more than a hysteresis, for several observations in a row (when a new link
reading made the best one, a newer reading among them), and not sooner than a minimum interval
after the last switch unless the links or the compute moved 4x since: a noisy but stationary
input never flips it back and forth, one reading taken while a rate changed never switches it
alone, and a fall from 1 Gbit/s to 20 Mbit/s a few seconds after a switch is not held back.
Operators pin parts of the policy (``[adaptive] pin``) and bound the rest (``min_wire``,
``syncs``, ``max_inner_steps``); a member that cannot run a policy (``cannot``) rules it out,
with its reason.

Pure logic, as the scheduler is: measurements and a clock come in, a :class:`Decision` goes out.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from daemon.contracts.clock import Clock
from daemon.contracts.config import AdaptiveConfig, TrainingConfig
from daemon.contracts.policy import WIRE_FORMATS, WIRE_RANK

#: Values per float32 scale in the int8 wire (the codec's ``INT8_BLOCK``; a test ties them).
INT8_BLOCK = 2048
#: The H the controller tries for DiLoCo (those up to ``max_inner_steps``, and the configured one).
INNER_STEPS_GRID = (5, 10, 20, 50, 100, 200, 500)
#: The fragments of a streaming candidate when ``[training]`` does not name streaming's.
STREAMING_FRAGMENTS = 5
#: How far the slowest link's rate or the slowest member's compute must have moved since the
#: last switch (either way) for the next one not to wait out ``min_interval_s``: the interval
#: keeps noise from flipping the policy, and a link that fell from 1 Gbit/s to 20 Mbit/s is
#: not noise. 4x, as netprobe retests a link whose reading is 4x off its estimate; jitter of
#: 1.5x each way stays below it.
MOVED = 4.0
#: A round measured this far above its bytes' time on the measured links is bound by something
#: else (the members' processing of each element, a box short of cores): what it took per
#: element is learned as its wire's floor. Below it, the measurement only bounds the floor.
EXCESS = 1.25
#: Floor estimates kept per wire. The floor is the least of them, once there are two: a
#: hiccup (a box busy for a moment) only ever makes a round slower, so one alone sets nothing
#: and one among others raises nothing.
FLOOR_SAMPLES = 3


def bytes_per_element(wire: str) -> float:
    """Bytes one gradient element takes on the wire in ``wire``."""
    if wire == "int8":
        return 1.0 + 4.0 / INT8_BLOCK
    return 4.0 if wire == "fp32" else 2.0


@dataclass(frozen=True, order=True)
class Candidate:
    """A policy the controller may choose."""

    sync: str  # every-step | diloco | streaming
    wire: str  # fp32 | fp16 | bf16 | int8
    inner_steps: int = 1  # DiLoCo's H (1 for every-step)
    fragments: int = 1  # streaming's (1 otherwise)
    overlap: bool = False  # streaming's: each round beside the next step's compute

    def label(self) -> str:
        mode = self.sync if self.sync == "every-step" else f"{self.sync} H={self.inner_steps}"
        if self.sync == "streaming":
            mode += f" P={self.fragments}" + (" overlap" if self.overlap else "")
        return f"{mode}/{self.wire}"

    @property
    def period(self) -> int:
        """Steps between two rounds."""
        return self.inner_steps // self.fragments


@dataclass(frozen=True)
class Hop:
    """One edge of the all-reduce tree, as the probes measured it."""

    rate_mbps: float
    rtt_ms: float
    reading: int = 0  # which bandwidth test of the link gave the rate (counted from 1)


Readings = tuple[tuple[float, int], ...]  # per tree hop: (rate, which test read it)


@dataclass(frozen=True)
class Measured:
    """What the cluster measured, the controller's whole input."""

    compute_s: Mapping[str, float]  # per member: seconds of forward, backward and step
    hops: Sequence[Hop]  # the tree's edges (none: a lone member)
    depth: int  # hops from the root to the deepest member
    elements: int  # elements of the round layout (the gradient, or DiLoCo's whole delta)


@dataclass(frozen=True)
class QualityPrior:
    """Extra steps a policy needs to reach the loss every-step fp32 reaches, as a fraction of
    them: the quality side of the trade, until the cluster has measured its own.

    A documented prior, set on the conservative side of what this project measured (the
    slow-links bench in BENCHMARKS.md, 3 seeds, 300 steps): int8 with error feedback and the
    half formats ended at fp32's loss, so they cost little here, enough that a switch must
    buy time; DiLoCo ended 2-3 % above every-step's validation loss (9-13 % on test) at the
    same steps, at H=20 and H=50 alike, a gap its outer steps did not close in that run, so it
    is charged half again as many steps, and more the longer the members drift apart.
    """

    wire: Mapping[str, float] = field(default_factory=lambda: {
        "fp32": 0.0, "fp16": 0.005, "bf16": 0.005, "int8": 0.01})
    diloco: float = 0.5
    per_inner_step: float = 0.002

    def extra(self, c: Candidate) -> float:
        # Streaming DiLoCo is charged as DiLoCo: its paper reports the same quality.
        drift = 0.0 if c.sync == "every-step" else self.diloco + self.per_inner_step * c.inner_steps
        return self.wire.get(c.wire, 0.0) + drift


class CostModel:
    """Step time and time per unit of progress of a candidate on measured links and compute.

    Synchronous data parallelism waits for the slowest member's compute. The all-reduce is
    pipelined in chunks down and up the tree, so the vector crosses the slowest hop once each
    way, the two directions at once, plus a round trip per level for the first chunk.
    DiLoCo pays the round once every H steps (not overlapped with the inner steps);
    streaming DiLoCo a ``fragments``-th of it every ``H / fragments`` steps: the same bytes,
    one more latency per fragment; with overlap a round runs beside one step's compute, so
    only what it takes beyond that step stalls.

    A round is also no faster than the members process its elements (reduce, encode, decode):
    a floor per wire format, learned from the rounds the cluster measured (:meth:`calibrate`),
    none until then. On a fast link it, not the bytes, bounds the round: the adaptive bench
    measured every-step int8 no faster than fp32 at 1 Gbit/s on 2 cores, where the bytes alone
    predicted it 16-25 % faster. On a slow link the bytes bound it and the floor changes
    nothing.
    """

    def __init__(self, prior: QualityPrior | None = None) -> None:
        self.prior = prior or QualityPrior()
        self._estimates: dict[str, deque[float]] = {}  # wire -> seconds per element, newest last

    def floor_s(self, wire: str) -> float:
        """Seconds per element a round of ``wire`` takes at least (0: not learned)."""
        est = self._estimates.get(wire)
        return min(est) if est and len(est) >= 2 else 0.0

    def floors(self) -> dict[str, float]:
        """The learned floors, in nanoseconds per element (the ``policy-changed`` event's)."""
        return {w: round(self.floor_s(w) * 1e9, 3) for w in sorted(self._estimates)
                if self.floor_s(w) > 0}

    def bytes_s(self, c: Candidate, m: Measured) -> float:
        """The seconds a round's bytes take to cross the slowest tree hop."""
        nbytes = m.elements / c.fragments * bytes_per_element(c.wire)
        return nbytes * 8.0 / (min(h.rate_mbps for h in m.hops) * 1e6)

    @staticmethod
    def latency_s(m: Measured) -> float:
        return m.depth * max(h.rtt_ms for h in m.hops) / 1000.0

    def round_s(self, c: Candidate, m: Measured) -> float:
        if not m.hops:
            return 0.0
        work = self.floor_s(c.wire) * m.elements / c.fragments
        return max(self.bytes_s(c, m), work) + self.latency_s(m)

    def calibrate(self, c: Candidate, m: Measured, step_s: float) -> bool:
        """The cluster measured ``step_s`` a step under every-step ``c`` on input ``m``:
        learn ``c``'s wire floor from it. True when the floor changed.

        Only every-step rounds are read: there the round is all of a step beyond the compute,
        where DiLoCo's is a sliver of H steps, lost in their noise. A round well above its
        bytes' time (:data:`EXCESS`) gives the floor: what it took per element. One near it
        may be bound by the bytes, so it only says the floor is no higher; a floor learned on
        a slow link would otherwise make every fast link look slow."""
        if c.sync != "every-step" or not m.hops or m.elements <= 0 or not m.compute_s:
            return False
        before = self.floor_s(c.wire)
        took = step_s - max(m.compute_s.values()) - self.latency_s(m)
        if took <= 0:
            return False
        per_element = took / m.elements
        est = self._estimates.setdefault(c.wire, deque(maxlen=FLOOR_SAMPLES))
        if took > EXCESS * self.bytes_s(c, m):
            est.append(per_element)
        else:
            kept = [e for e in est if e <= per_element]
            est.clear()
            est.extend(kept)
        return self.floor_s(c.wire) != before

    def step_s(self, c: Candidate, m: Measured) -> float:
        compute = max(m.compute_s.values(), default=0.0)
        round_s = self.round_s(c, m)
        if c.overlap:
            round_s = max(0.0, round_s - compute)
        return compute + round_s / c.period

    def cost(self, c: Candidate, m: Measured) -> float:
        """Seconds per unit of progress: the step time, times the extra steps needed."""
        return self.step_s(c, m) * (1.0 + self.prior.extra(c))


@dataclass(frozen=True)
class Decision:
    """A switch the controller made, and why (the ``policy-changed`` event's detail)."""

    policy: Candidate
    previous: Candidate
    predicted_step_s: float  # the new policy's step time, as predicted
    previous_step_s: float  # the policy in force's, by the same model on the same input
    gain: float  # 1 - cost(new) / cost(previous)
    ruled_out: dict[str, str]  # candidate label -> why a member cannot run it

    def reason(self) -> str:
        return (f"{self.policy.label()} predicted {self.predicted_step_s * 1000:.0f} ms a step "
                f"against {self.previous_step_s * 1000:.0f} ms for {self.previous.label()}: "
                f"{self.gain:.0%} less time to the same loss")


def configured(tr: TrainingConfig) -> Candidate:
    """The policy ``[training]`` names: where the controller starts, and what pins keep."""
    if tr.sync == "streaming":
        return Candidate(tr.sync, tr.wire, tr.inner_steps, tr.fragments, tr.overlap)
    return Candidate(tr.sync, tr.wire, tr.inner_steps if tr.sync == "diloco" else 1)


class Controller:
    """Chooses the cluster's policy; call :meth:`observe` with every new measurement."""

    def __init__(self, cfg: AdaptiveConfig, training: TrainingConfig, clock: Clock,
                 model: CostModel | None = None,
                 cannot: Callable[[Candidate], str | None] | None = None) -> None:
        self.cfg = cfg
        self.clock = clock
        self.model = model or CostModel()
        self.cannot = cannot or (lambda _c: None)
        self.configured = configured(training)
        self.pins: frozenset[str] = frozenset(cfg.pin)  # parts of ``pinned`` kept as they are
        self.pinned = self.configured
        self.current = self.pinned
        self._leader: Candidate | None = None  # the best, while it keeps beating the current
        self._streak = 0
        # The link readings of the last observation, and of the one where the leader emerged
        # if a new link reading made it (None: compute made it). Such a leader waits for a
        # newer reading: observations come every few seconds and link tests far less often,
        # so "several in a row" could all be one reading, taken while the rate changed. A
        # reading is its rate and its number: a shaped link often reads the same twice.
        self._readings: Readings | None = None
        self._leader_readings: Readings | None = None
        self._switched_at: float | None = None
        self._switched_on: tuple[float, float] | None = None  # (slowest rate, compute) then

    @staticmethod
    def _regime(m: Measured) -> tuple[float, float]:
        """What a switch is made on: the slowest link's rate and the slowest member's compute."""
        return (min((h.rate_mbps for h in m.hops), default=math.inf),
                max(m.compute_s.values(), default=0.0))

    def _moved(self, m: Measured) -> bool:
        """The slowest link or member moved :data:`MOVED`-fold since the last switch."""
        if self._switched_on is None:
            return False
        return any(min(a, b) > 0 and math.isfinite(max(a, b)) and max(a, b) / min(a, b) >= MOVED
                   for a, b in zip(self._switched_on, self._regime(m), strict=True))

    def pin(self, parts: Iterable[str], policy: Candidate) -> None:
        """The operator sets ``parts`` (of :data:`ADAPTIVE_PINS`) to ``policy``'s and keeps
        them there (``chaosctl policy set``), besides ``[adaptive] pin``; ``policy`` is in
        force now."""
        self.pins = self.pins | set(parts)
        self.pinned = policy
        self.current = policy
        self._leader, self._streak = None, 0
        self._leader_readings = None

    def release(self) -> None:
        """Back to the configured pins only (``chaosctl policy auto``)."""
        self.pins = frozenset(self.cfg.pin)
        self.pinned = self.configured

    def candidates(self) -> list[Candidate]:
        """Every policy the pins and bounds allow (the current one among them if it is)."""
        cfg, pin = self.cfg, self.pinned
        syncs = [pin.sync] if "sync" in self.pins else list(cfg.syncs)
        wires = [pin.wire] if "wire" in self.pins else [
            w for w in WIRE_FORMATS if WIRE_RANK[w] >= WIRE_RANK[cfg.min_wire]]
        out: list[Candidate] = []
        for sync in syncs:
            if sync == "every-step":
                hs = [1]
            elif "inner_steps" in self.pins:
                hs = [pin.inner_steps]
            else:
                hs = sorted({h for h in INNER_STEPS_GRID if h <= cfg.max_inner_steps}
                            | ({pin.inner_steps} if pin.sync != "every-step"
                               and pin.inner_steps <= cfg.max_inner_steps else set()))
            parts, overlap = 1, False
            if sync == "streaming":
                parts = pin.fragments if pin.sync == "streaming" else STREAMING_FRAGMENTS
                overlap = pin.overlap if pin.sync == "streaming" else True
                hs = [h for h in hs if h % parts == 0 and (not overlap or h // parts >= 2)]
            out.extend(Candidate(sync, w, h, parts, overlap) for w in wires for h in hs)
        return sorted(out)

    def observe(self, m: Measured) -> Decision | None:
        """Judge one measurement; a :class:`Decision` when the controller switches now."""
        ruled_out: dict[str, str] = {}
        allowed = []
        for c in self.candidates():
            why = self.cannot(c)
            if why is None:
                allowed.append(c)
            else:
                ruled_out[c.label()] = why
        if not allowed or not m.compute_s:
            return None
        cost = {c: self.model.cost(c, m) for c in allowed}
        best = min(allowed, key=lambda c: (cost[c], c))
        now_cost = self.model.cost(self.current, m)
        gain = 1.0 - cost[best] / now_cost if now_cost > 0 else 0.0
        now = self.clock.monotonic()
        readings, previous = tuple((h.rate_mbps, h.reading) for h in m.hops), self._readings
        self._readings = readings
        # A policy a member cannot run (one joined with a GradScaler under DiLoCo) is left at
        # once, whatever the gain: the rounds cannot go on under it.
        if self.current in allowed:
            if best == self.current or gain <= self.cfg.hysteresis or not math.isfinite(gain):
                self._leader, self._streak, self._leader_readings = None, 0, None
                return None
            if best != self._leader:
                self._leader, self._streak = best, 0
                self._leader_readings = readings if readings != previous else None
            self._streak += 1
            if self._streak < self.cfg.dwell or (self.cfg.dwell > 1
                                                 and readings == self._leader_readings) or (
                    self._switched_at is not None
                    and now - self._switched_at < self.cfg.min_interval_s
                    and not self._moved(m)):
                return None
        decision = Decision(best, self.current, self.model.step_s(best, m),
                            self.model.step_s(self.current, m), gain, ruled_out)
        self.current, self._switched_at = best, now
        self._switched_on = self._regime(m)
        self._leader, self._streak, self._leader_readings = None, 0, None
        return decision
