"""The paper's planner (``paper``): Algorithm 1 (binary search on the shard size) around
Algorithm 2. A baseline now: the default ``chaos`` is water-filling, which is never worse.

Algorithm 2 (greedy shard assignment, P3) starts each neighbour's load at
``l_u = t_prop_u + tau_sync_u`` and gives every shard to ``argmin_u(l_u + size * t_u)``, then adds
that cost to ``l_u``. The paper says it "reduces to LPT" and quotes Graham's
``(4/3 - 1/(3|U|)) * OPT`` bound; that bound is for LPT order (largest shard first) on identical
machines. So we feed the shards largest first (stable in byte order); for identical neighbours
the bound then holds, and for any neighbours every finish time stays below the water-filling
level plus one largest shard on the slowest neighbour in use.

Algorithm 1 binary-searches the integer shard size ``s`` in ``[min tensor size, max tensor
size]``: split every tensor into shards of ``s`` bytes (the last one of a tensor may be shorter),
run Algorithm 2, keep the best ``s``, and move to smaller sizes while the makespan improves.
Shards are never smaller than the smallest tensor: a state of one large tensor goes whole to one
neighbour (the single-source time), and equal tensors are only ever assigned whole.

Run time: all shards of one size are identical, so we assign each run of equal shards at once
with :func:`~.waterfill.assign_identical`, which yields the counts the
one-by-one loop yields. A call of Algorithm 2 costs O(D |U| log |U|) for D distinct shard sizes,
not O(K |U|) for K shards: 10-15 ms for 64 neighbours and GPT-2 large (3 GiB, 436 tensors).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from chaos_edge.replication.planning.model import (
    Neighbor,
    PlanInput,
    Range,
    ReplicationPlan,
    build_plan,
)
from chaos_edge.replication.planning.waterfill import FloatArray, IntArray, assign_identical


def greedy_assign(shard_sizes: Sequence[int], neighbors: Sequence[Neighbor]) -> list[int]:
    """Algorithm 2 exactly as printed: shards one by one, in the order given.

    This is the reference the fast path is tested against; it costs O(K |U|).

    Args:
        shard_sizes: Shard sizes in bytes, in assignment order.
        neighbors: The neighbours.

    Returns:
        For each shard, the index of the neighbour it goes to.
    """
    load = [n.ready_s for n in neighbors]
    t = [n.t_trans_s_per_byte for n in neighbors]
    owner: list[int] = []
    for size in shard_sizes:
        best = min(range(len(load)), key=lambda u: load[u] + size * t[u])
        load[best] += size * t[best]
        owner.append(best)
    return owner


def lpt_order(shard_sizes: Sequence[int]) -> list[int]:
    """Indices of the shards, largest first, ties in the order given (LPT order)."""
    return sorted(range(len(shard_sizes)), key=lambda k: -shard_sizes[k])


def split_shards(segments: Sequence[int], s: int) -> list[int]:
    """Split every segment into shards of ``s`` bytes (each segment's last shard may be shorter).

    Returns:
        Shard sizes in byte order.
    """
    out: list[int] = []
    for n in segments:
        q, r = divmod(n, s)
        out.extend([s] * q)
        if r:
            out.append(r)
    return out


def _runs(sizes: IntArray, s: int) -> tuple[int, IntArray, IntArray]:
    """Shards of size ``s`` per tensor: (number of full shards, distinct tails, their counts)."""
    full = int((sizes // s).sum())
    tails = sizes % s
    values, counts = np.unique(tails[tails > 0], return_counts=True)
    return full, values[::-1], counts[::-1]


@dataclass(frozen=True)
class GreedyResult:
    """Algorithm 2's outcome for one shard size, as counts per run of equal shards."""

    s: int
    full: IntArray  # full shards per neighbour
    tail_sizes: IntArray  # distinct tail sizes, largest first
    tail_counts: IntArray  # shape (len(tail_sizes), |U|)
    makespan_s: float


def greedy_runs(sizes: IntArray, s: int, ready: FloatArray, t: FloatArray) -> GreedyResult:
    """Algorithm 2 in LPT order on the shards of size ``s``, one run of equal shards at a time."""
    full, tail_sizes, tail_n = _runs(sizes, s)
    load = ready.copy()
    full_counts = assign_identical(load, s * t, full)
    load += full_counts * s * t
    per_tail = np.zeros((len(tail_sizes), len(ready)), dtype=np.int64)
    for i, (size, count) in enumerate(zip(tail_sizes.tolist(), tail_n.tolist(), strict=True)):
        per_tail[i] = assign_identical(load, size * t, count)
        load += per_tail[i] * size * t
    used = (full_counts + per_tail.sum(axis=0)) > 0
    return GreedyResult(s, full_counts, tail_sizes, per_tail, float(load[used].max()))


def algorithm1(
    inputs: PlanInput, s_range: tuple[int, int] | None = None
) -> tuple[GreedyResult, int]:
    """Algorithm 1: binary search on ``s`` with Algorithm 2 inside.

    Args:
        inputs: Planner inputs; ``segments`` are the tensors to split.
        s_range: ``(s_l, s_h)``; the paper's ``(min tensor size, max tensor size)`` when None.

    Returns:
        The best result found and the number of Algorithm 2 calls made.
    """
    sizes = np.array(inputs.segments, dtype=np.int64)
    ready = np.array([n.ready_s for n in inputs.neighbors], dtype=np.float64)
    t = np.array([n.t_trans_s_per_byte for n in inputs.neighbors], dtype=np.float64)
    s_lo, s_hi = s_range if s_range else (int(sizes.min()), int(sizes.max()))
    best: GreedyResult | None = None
    calls = 0
    while s_lo <= s_hi:
        s = (s_lo + s_hi) // 2
        result = greedy_runs(sizes, s, ready, t)
        calls += 1
        if best is None or result.makespan_s < best.makespan_s:
            best, s_hi = result, s - 1
        else:
            s_lo = s + 1
    assert best is not None  # the loop runs at least once: s_lo <= s_hi initially
    return best, calls


def _materialise(inputs: PlanInput, res: GreedyResult) -> dict[str, list[Range]]:
    """Turn per-run counts into byte ranges: equal shards are dealt out in byte order."""
    sizes = list(inputs.segments)
    offsets = np.concatenate(([0], np.cumsum(sizes)[:-1])).tolist()
    ids = [n.id for n in inputs.neighbors]
    ranges: dict[str, list[Range]] = {i: [] for i in ids}
    s = res.s
    # Full shards: walk the tensors' full-shard regions, handing each neighbour its count.
    seg, used_in_seg = 0, 0
    for u, need in enumerate(res.full.tolist()):
        while need > 0:
            q = sizes[seg] // s
            take = min(need, q - used_in_seg)
            if take > 0:
                ranges[ids[u]].append((offsets[seg] + used_in_seg * s, take * s))
                used_in_seg += take
                need -= take
            if used_in_seg == q:
                seg, used_in_seg = seg + 1, 0
    # Tails: the tensors whose tail has a given size, in byte order, dealt out by count.
    for size, counts in zip(res.tail_sizes.tolist(), res.tail_counts, strict=True):
        owners = np.repeat(np.arange(len(ids)), counts).tolist()
        k = 0
        for i, n in enumerate(sizes):
            if n % s == size:
                ranges[ids[owners[k]]].append((offsets[i] + n - size, size))
                k += 1
    return ranges


def paper_plan(inputs: PlanInput, s_range: tuple[int, int] | None = None) -> ReplicationPlan:
    """The paper's planner (Algorithms 1 and 2), as byte ranges: the ``paper`` baseline.

    Args:
        inputs: Planner inputs; ``segments`` should be the state's tensors in byte order.
        s_range: Override of the binary search range ``(s_l, s_h)``.
    """
    res, calls = algorithm1(inputs, s_range)
    meta = {"shard_size": res.s, "algorithm2_calls": calls, "order": "lpt"}
    return build_plan("paper", inputs, _materialise(inputs, res), meta)


def greedy_plan(inputs: PlanInput) -> ReplicationPlan:
    """Algorithm 2 alone on the raw tensors (no splitting): the paper's motivating baseline."""
    s = max(inputs.segments)
    sizes = np.array(inputs.segments, dtype=np.int64)
    ready = np.array([n.ready_s for n in inputs.neighbors], dtype=np.float64)
    t = np.array([n.t_trans_s_per_byte for n in inputs.neighbors], dtype=np.float64)
    res = greedy_runs(sizes, s, ready, t)
    return build_plan("greedy", inputs, _materialise(inputs, res), {"shard_size": s})
