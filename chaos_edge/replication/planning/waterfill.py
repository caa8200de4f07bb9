"""The exact optimum by water-filling (``chaos``, ``waterfill``) and two baselines (``single``,
``even``).

Relaxing bytes to a continuous quantity, the cost model of :mod:`~.model`
gives the level ``theta`` at which

    sum_u max(0, theta - a_u) / t_u = |w|

(fill each neighbour's "tank" above its ready time ``a_u`` at rate ``1/t_u``). No assignment of
``|w|`` bytes finishes before ``theta``: if the makespan were ``M < theta``, each neighbour could
send at most ``max(0, M - a_u) / t_u`` bytes, fewer than ``|w|`` in total. So ``theta`` is the
lower bound every planner is measured against. The ``waterfill`` planner then rounds it to whole
units (bytes, or ``align_bytes``) optimally: giving units one at a time to the neighbour that
would finish them first is optimal for identical units, and :func:`assign_identical` does exactly
that in O(|U| log |U|) rather than one unit at a time. The default planner ``chaos`` is the same
with whole bytes as the unit: the integer optimum, which no other plan beats.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from chaos_edge.replication.planning.model import PlanInput, Range, ReplicationPlan, build_plan

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def water_level(ready: FloatArray, rate_cost: FloatArray, amount: float) -> float:
    """Solve ``sum_u max(0, theta - ready_u) / rate_cost_u = amount`` for ``theta``.

    Args:
        ready: Per-neighbour time before which it cannot deliver anything.
        rate_cost: Per-neighbour time per unit of data (> 0).
        amount: Units to deliver (>= 0).

    Returns:
        The level ``theta`` (``min(ready)`` when ``amount`` is 0).
    """
    if len(ready) == 1:
        return float(ready[0] + amount * rate_cost[0])
    order = np.argsort(ready)
    a = ready[order]
    w = 1.0 / rate_cost[order]
    # With the k cheapest-to-start neighbours active, theta_k = (amount + sum a w) / sum w;
    # the right k is the first whose level does not reach the next neighbour's ready time.
    theta = (np.cumsum(a * w) + amount) / np.cumsum(w)
    fits = theta[:-1] <= a[1:]
    k = int(fits.argmax())
    return float(theta[k] if fits[k] else theta[-1])


def assign_identical(load: FloatArray, unit_cost: FloatArray, count: int) -> IntArray:
    """Greedy least-loaded assignment of ``count`` identical items, all at once.

    Gives the same counts as assigning the items one by one to
    ``argmin_u(load_u + unit_cost_u)`` and updating ``load`` (Algorithm 2's loop), up to ties:
    that loop takes the ``count`` smallest "slots" ``load_u + k * unit_cost_u`` (k >= 1), and
    so do we: first every slot below the continuous water level, then the few slots left.

    Args:
        load: Current per-neighbour load (finish time so far).
        unit_cost: Time one item adds on each neighbour.
        count: Number of items.

    Returns:
        Items per neighbour, summing to ``count``.
    """
    n = len(load)
    counts = np.zeros(n, dtype=np.int64)
    if count <= 0:
        return counts
    if count <= _FEW:
        # A few items: Algorithm 2's own loop is cheapest.
        nxt = load + unit_cost
        for _ in range(count):
            u = int(nxt.argmin())
            counts[u] += 1
            nxt[u] += unit_cost[u]
        return counts
    if count <= _SMALL and count < n:
        # Only the `count` neighbours with the earliest first slot can take any item.
        rows = np.argpartition(load + unit_cost, count - 1)[:count]
        counts[rows] = _top_slots(load[rows], unit_cost[rows], np.zeros(count, np.int64), count)
        return counts
    theta = water_level(load, unit_cost, float(count))
    # The factor keeps float noise from counting a slot just above the level.
    counts = ((theta - load) / unit_cost * (1.0 - 1e-12)).clip(0.0, None).astype(np.int64)
    left = count - int(counts.sum())
    while left < 0:  # only after pathological rounding: drop the latest slots
        last = np.where(counts > 0, load + counts * unit_cost, -np.inf)
        counts[int(np.argmax(last))] -= 1
        left += 1
    # Every slot still free is above the level: the rest are the `left` smallest of them.
    return _top_slots(load, unit_cost, counts, left) if left else counts


_FEW = 3  # up to this many items, the one-by-one loop beats the vector path
_SMALL = 16  # up to this many, a count x count slot matrix beats the water level


def _top_slots(load: FloatArray, unit_cost: FloatArray, counts: IntArray, m: int) -> IntArray:
    """Add the ``m`` smallest slots after each neighbour's ``counts`` taken ones.

    Any neighbour can take at most ``m`` of them, and its slots increase, so the ``m``
    smallest of each neighbour's next ``m`` slots are the answer (a prefix per neighbour).
    """
    steps = np.arange(1, m + 1, dtype=np.float64)
    cand = (load + counts * unit_cost)[:, None] + steps[None, :] * unit_cost[:, None]
    pick = np.argpartition(cand.ravel(), m - 1)[:m] if m < cand.size else np.arange(m)
    return counts + np.bincount(pick // m, minlength=len(load))


def lower_bound(inputs: PlanInput) -> float:
    """The continuous optimum ``theta``: no plan of ``inputs`` has a smaller makespan."""
    ready = np.array([n.ready_s for n in inputs.neighbors], dtype=np.float64)
    t = np.array([n.t_trans_s_per_byte for n in inputs.neighbors], dtype=np.float64)
    return water_level(ready, t, float(inputs.total_bytes))


def contiguous_ranges(inputs: PlanInput, nbytes: IntArray | list[int]) -> dict[str, list[Range]]:
    """Lay per-neighbour byte counts out as one contiguous range each, in neighbour order."""
    out: dict[str, list[Range]] = {}
    offset = 0
    for n, count in zip(inputs.neighbors, nbytes, strict=True):
        out[n.id] = [(offset, int(count))] if count > 0 else []
        offset += int(count)
    return out


def _units_to_bytes(inputs: PlanInput, units: IntArray, tail_owner: int) -> IntArray:
    """Convert aligned unit counts to bytes; the short last unit belongs to ``tail_owner``."""
    align = inputs.align_bytes
    nbytes = units * align
    short = (-inputs.total_bytes) % align
    if short:
        nbytes[tail_owner] -= short
    return nbytes


def _waterfill(inputs: PlanInput, align: int) -> tuple[dict[str, list[Range]], float]:
    """Water-filled ranges at ``align``-byte granularity (one per neighbour), and ``theta``."""
    ready = np.array([n.ready_s for n in inputs.neighbors], dtype=np.float64)
    t = np.array([n.t_trans_s_per_byte for n in inputs.neighbors], dtype=np.float64)
    full, tail = divmod(inputs.total_bytes, align)
    units = assign_identical(ready, t * align, full)
    tail_owner = len(ready) - 1
    if tail:
        load = np.where(units > 0, ready + units * t * align, ready)
        tail_owner = int(np.argmin(load + tail * t))
        units[tail_owner] += 1
    nbytes = units * align
    if tail:
        nbytes[tail_owner] -= align - tail
    # The neighbour holding the short unit goes last, so that every other boundary is aligned.
    order = [i for i in range(len(ready)) if i != tail_owner] + [tail_owner]
    ranges: dict[str, list[Range]] = {}
    offset = 0
    for i in order:
        count = int(nbytes[i])
        ranges[inputs.neighbors[i].id] = [(offset, count)] if count > 0 else []
        offset += count
    return ranges, water_level(ready, t, float(inputs.total_bytes))


def waterfill_plan(inputs: PlanInput) -> ReplicationPlan:
    """The optimal plan over contiguous byte ranges (one per neighbour), to ``align_bytes``."""
    ranges, theta = _waterfill(inputs, inputs.align_bytes)
    return build_plan("waterfill", inputs, ranges, {"lower_bound_s": theta})


def chaos_plan(inputs: PlanInput) -> ReplicationPlan:
    """The default planner (``chaos``): water-filling to the byte, whatever ``align_bytes`` says.

    With whole bytes as the unit this is the integer optimum over every way of splitting the
    state among the neighbours (the makespan depends only on how many bytes each sends), so no
    plan has a smaller modelled makespan: not ``waterfill`` to ``align_bytes`` (it pays up to
    one unit of rounding on a link), not Algorithms 1+2 (``paper``), which need tensors small
    enough to balance and put a state of one large tensor on one neighbour. Running Algorithm 1
    as well could therefore never win, and it costs about 12 ms for 64 neighbours and GPT-2
    large; this costs under 1 ms. Ranges follow neither tensors nor checksum blocks: the state
    is one byte space, servers send any range of it, and the fetch verifies a block split
    between two sources once both parts are in. One range per neighbour, the fewest possible.
    """
    ranges, theta = _waterfill(inputs, 1)
    return build_plan("chaos", inputs, ranges, {"lower_bound_s": theta, "method": "waterfill"})


def even_plan(inputs: PlanInput) -> ReplicationPlan:
    """Autoscaling's multi-source split: equal shares for every given source.

    The hop-by-hop relay of Autoscaling is a data-plane matter; pass the relayed sources'
    effective delays as their ``Neighbor`` values to predict it.
    """
    n = len(inputs.neighbors)
    align = inputs.align_bytes
    full = -(-inputs.total_bytes // align)
    units = np.full(n, full // n, dtype=np.int64)
    units[: full % n] += 1
    nbytes = _units_to_bytes(inputs, units, int(np.flatnonzero(units)[-1]))
    return build_plan("even", inputs, contiguous_ranges(inputs, nbytes))


def single_plan(inputs: PlanInput) -> ReplicationPlan:
    """EDL+: the whole state from the one neighbour that would finish it first."""
    best = min(inputs.neighbors, key=lambda n: n.finish_s(inputs.total_bytes))
    ranges = {best.id: [(0, inputs.total_bytes)]}
    return build_plan("single", inputs, ranges, {"source": best.id})
