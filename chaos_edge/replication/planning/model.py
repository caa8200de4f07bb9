"""Planner inputs, plans, and the cost model every planner is judged by.

Cost model (the paper's eq. (1)-(2), section III-A, with bytes as the unit of data): a
neighbour ``u`` that sends ``b_u > 0`` bytes finishes at::

    finish_u = a_u + t_u * b_u,    a_u = tau_sync_u + t_prop_u,  t_u = t_trans_s_per_byte

``tau_sync_u`` is when ``u`` finishes its all-reduce (replication starts after it), ``t_prop_u``
the propagation delay of the link to the new node, ``t_u`` its per-byte transmission delay.
Links to the new node are assumed independent (the new node's NIC is not a shared bottleneck;
the probes measure each link's rate as seen by the new node). The makespan is the latest finish
over the neighbours that send something. A neighbour that sends nothing costs nothing: the
paper's P2 keeps ``theta >= a_u`` for every ``u``, which would let an idle straggler set the
makespan, so we drop that term (its Algorithm 2 never forces a shard on a neighbour either).
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from chaos_edge.replication.errors import PlanError

Range = tuple[int, int]  # (offset, length) in bytes


@dataclass(frozen=True)
class Neighbor:
    """One existing node that can serve bytes to the new node.

    Attributes:
        id: Node id.
        t_prop_s: Propagation delay of the link to the new node, seconds.
        t_trans_s_per_byte: Transmission delay per byte (1 / bandwidth in bytes/s).
        tau_sync_s: When this neighbour finishes the current all-reduce, seconds from now.
    """

    id: str
    t_prop_s: float
    t_trans_s_per_byte: float
    tau_sync_s: float = 0.0

    def __post_init__(self) -> None:
        if not self.id:
            raise PlanError("neighbor id must be a non-empty string")
        for key in ("t_prop_s", "tau_sync_s"):
            value = getattr(self, key)
            if not math.isfinite(value) or value < 0:
                raise PlanError(f"neighbor {self.id}: {key} must be finite and >= 0, got {value}")
        t = self.t_trans_s_per_byte
        if not math.isfinite(t) or t <= 0:
            raise PlanError(f"neighbor {self.id}: t_trans_s_per_byte must be > 0, got {t}")

    @property
    def ready_s(self) -> float:
        """Time at which this neighbour's first byte can arrive: ``tau_sync + t_prop``."""
        return self.tau_sync_s + self.t_prop_s

    def finish_s(self, nbytes: int) -> float:
        """Predicted finish time when sending ``nbytes`` (0.0 when it sends nothing)."""
        return self.ready_s + self.t_trans_s_per_byte * nbytes if nbytes > 0 else 0.0


@dataclass(frozen=True)
class PlanInput:
    """Everything a planner sees; JSON-serialisable so that it can be recorded in the event.

    Attributes:
        neighbors: The new node's neighbours, in a fixed order (ties go to the earlier one).
        segments: Sizes in bytes of the consecutive segments (tensors) of the byte space.
            Algorithms 1 and 2 (``paper``, ``greedy``) and the exact assignments split or
            place these; the other planners only need the total.
        total_bytes: Size of the byte space; must equal ``sum(segments)``.
        align_bytes: Range boundaries of ``waterfill``/``even``/``single`` plans fall on
            multiples of this (use the manifest's block size to make every range verifiable
            on its own). The default ``chaos`` cuts to the byte (rounding to blocks can cost a
            block on a slow link) and Algorithm 1 follows tensor boundaries; the fetch
            verifies a block split between two sources once both parts are in.
    """

    neighbors: tuple[Neighbor, ...]
    segments: tuple[int, ...]
    total_bytes: int
    align_bytes: int = 1

    def __post_init__(self) -> None:
        if not self.neighbors:
            raise PlanError("a plan needs at least one neighbor")
        ids = [n.id for n in self.neighbors]
        if len(set(ids)) != len(ids):
            raise PlanError(f"neighbor ids must be unique, got {ids}")
        if self.total_bytes <= 0:
            raise PlanError(f"total_bytes must be > 0, got {self.total_bytes}")
        if any(s <= 0 for s in self.segments):
            raise PlanError("every segment must have a positive size")
        if sum(self.segments) != self.total_bytes:
            raise PlanError(
                f"segments sum to {sum(self.segments)}, but total_bytes is {self.total_bytes}"
            )
        if self.align_bytes <= 0:
            raise PlanError(f"align_bytes must be > 0, got {self.align_bytes}")

    @classmethod
    def create(
        cls,
        neighbors: Iterable[Neighbor],
        segments: Iterable[int],
        align_bytes: int = 1,
    ) -> PlanInput:
        """Build an input from neighbours and segment sizes; the total is their sum."""
        segs = tuple(int(s) for s in segments)
        return cls(tuple(neighbors), segs, sum(segs), align_bytes)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PlanInput:
        """Inverse of :meth:`to_dict`; raises :class:`PlanError` on a malformed dict."""
        try:
            neighbors = tuple(Neighbor(**n) for n in data["neighbors"])
            return cls(
                neighbors,
                tuple(int(s) for s in data["segments"]),
                int(data["total_bytes"]),
                int(data.get("align_bytes", 1)),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise PlanError(f"malformed plan input: {exc}") from None


@dataclass(frozen=True)
class ReplicationPlan:
    """Which byte ranges each neighbour sends, and when it is predicted to finish.

    Attributes:
        planner: Name of the planner that made it.
        inputs: The planner's inputs.
        ranges: Neighbour id -> sorted, disjoint ``(offset, length)`` ranges (may be empty).
        finish_s: Neighbour id -> predicted finish time; neighbours that send nothing are absent.
        makespan_s: Predicted time at which the last byte arrives.
        meta: Planner-specific facts (chosen shard size, lower bound, ...), JSON values only.
    """

    planner: str
    inputs: PlanInput
    ranges: Mapping[str, tuple[Range, ...]]
    finish_s: Mapping[str, float]
    makespan_s: float
    meta: Mapping[str, Any] = field(default_factory=dict)

    def bytes_of(self, neighbor_id: str) -> int:
        """Number of bytes a neighbour sends."""
        return sum(length for _, length in self.ranges.get(neighbor_id, ()))

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict."""
        return {
            "planner": self.planner,
            "inputs": self.inputs.to_dict(),
            "ranges": {k: [list(r) for r in v] for k, v in self.ranges.items()},
            "finish_s": dict(self.finish_s),
            "makespan_s": self.makespan_s,
            "meta": dict(self.meta),
        }

    def to_json(self) -> str:
        """Serialise deterministically."""
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicationPlan:
        """Inverse of :meth:`to_dict`; raises :class:`PlanError` on a malformed dict."""
        try:
            ranges = {
                str(k): tuple((int(o), int(n)) for o, n in v) for k, v in data["ranges"].items()
            }
            return cls(
                str(data["planner"]),
                PlanInput.from_dict(data["inputs"]),
                ranges,
                {str(k): float(v) for k, v in data["finish_s"].items()},
                float(data["makespan_s"]),
                dict(data.get("meta", {})),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise PlanError(f"malformed plan: {exc}") from None


def merge_ranges(ranges: Iterable[Range]) -> tuple[Range, ...]:
    """Sort ranges, drop empty ones, and join those that touch."""
    out: list[list[int]] = []
    for off, length in sorted(r for r in ranges if r[1] > 0):
        if out and out[-1][0] + out[-1][1] == off:
            out[-1][1] += length
        else:
            out.append([off, length])
    return tuple((o, n) for o, n in out)


def subtract_ranges(ranges: Iterable[Range], remove: Iterable[Range]) -> tuple[Range, ...]:
    """Bytes of ``ranges`` that are not in ``remove``, as merged ranges."""
    cuts = merge_ranges(remove)
    out: list[Range] = []
    for off, length in merge_ranges(ranges):
        start, end = off, off + length
        for c_off, c_len in cuts:
            c_end = c_off + c_len
            if c_end <= start or c_off >= end:
                continue
            if c_off > start:
                out.append((start, c_off - start))
            start = max(start, c_end)
            if start >= end:
                break
        if start < end:
            out.append((start, end - start))
    return merge_ranges(out)


def build_plan(
    planner: str,
    inputs: PlanInput,
    ranges: Mapping[str, Iterable[Range]],
    meta: Mapping[str, Any] | None = None,
) -> ReplicationPlan:
    """Attach predicted finish times and the makespan to per-neighbour ranges."""
    merged = {n.id: merge_ranges(ranges.get(n.id, ())) for n in inputs.neighbors}
    finish: dict[str, float] = {}
    for n in inputs.neighbors:
        nbytes = sum(length for _, length in merged[n.id])
        if nbytes > 0:
            finish[n.id] = n.finish_s(nbytes)
    return ReplicationPlan(
        planner, inputs, merged, finish, max(finish.values(), default=0.0), dict(meta or {})
    )


def check_cover(plan: ReplicationPlan, expected: Sequence[Range] | None = None) -> None:
    """Raise :class:`PlanError` unless the plan covers ``expected`` exactly once.

    Args:
        plan: The plan to check.
        expected: The bytes the plan must cover; ``[(0, total_bytes)]`` when None.
    """
    target = merge_ranges(expected if expected is not None else [(0, plan.inputs.total_bytes)])
    known = {n.id for n in plan.inputs.neighbors}
    if set(plan.ranges) - known:
        raise PlanError(f"plan names unknown neighbors {sorted(set(plan.ranges) - known)}")
    every = sorted(r for v in plan.ranges.values() for r in v if r[1] > 0)
    for (o1, n1), (o2, _) in itertools.pairwise(every):
        if o1 + n1 > o2:
            raise PlanError(f"plan ranges overlap at byte {o2}")
    if merge_ranges(every) != target:
        raise PlanError("plan does not cover the expected bytes exactly")
