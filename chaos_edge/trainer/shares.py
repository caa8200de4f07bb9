"""Which samples of the global batch each member takes: the script's view of the cluster.

:class:`Shard` tells a script, at every step, the members of the next round, its index among
them, the global batch and its own slice of it, so that a data loader reshards the same way
on every member when the cluster changes (positions ``start .. start + size`` of the step's
global batch are this member's).

Without a fixed global batch each member takes ``samples_per_step``. In *consistent mode*
(``Trainer(global_batch=G)``) the global batch stays ``G`` whoever comes and goes, so the
gradient's scale and noise stay those of the static run, and each member's share follows its
measured speed: a slow box gets fewer samples rather than holding the others back. The speeds
ride in the round itself (one slot per member), so every member computes the same shares
from the same numbers; a member without a measurement yet (a joiner's first round) makes the
step split evenly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

SLOTS = 64  # speed slots per round: beyond this many members the split is even
SPEED_EMA = 0.3  # weight of the newest measurement in a member's own speed estimate


@dataclass(frozen=True)
class Shard:
    """This member's part of one step.

    Attributes:
        step: The step it is for (the round ``update()`` runs next is ``step``).
        members: The members of that round, sorted.
        index: This member's index in ``members``.
        global_batch: Samples of the whole step.
        size: This member's samples.
        start: Its first position in the step's global batch.
    """

    step: int
    members: tuple[str, ...]
    index: int
    global_batch: int
    size: int
    start: int


def split(total: int, weights: Sequence[float]) -> list[int]:
    """``total`` split in proportion to ``weights`` (largest remainders; every part at least 1
    when ``total`` allows; even when a weight is missing). Deterministic."""
    n = len(weights)
    if n == 0:
        return []
    if any(not w > 0 for w in weights) or total < n:
        base, extra = divmod(total, n)
        return [base + (1 if i < extra else 0) for i in range(n)]
    rest = total - n  # one each first: nobody idles
    scale = rest / sum(weights)
    raw = [w * scale for w in weights]
    parts = [int(r) for r in raw]
    order = sorted(range(n), key=lambda i: (-(raw[i] - parts[i]), i))
    for i in order[: rest - sum(parts)]:
        parts[i] += 1
    return [p + 1 for p in parts]


def shard_of(step: int, members: Sequence[str], me: str, *, per_member: int,
             global_batch: int | None, speeds: Sequence[float] | None) -> Shard:
    """This member's shard of ``step``.

    Args:
        step: The step.
        members: The round's members (any order; sorted here).
        me: This member (it must be among them).
        per_member: Samples per member without a global batch.
        global_batch: The fixed global batch (consistent mode), or None.
        speeds: The members' relative speeds in sorted-member order, or None (even split).
    """
    ms = tuple(sorted(members))
    index = ms.index(me)
    if global_batch is None:
        return Shard(step, ms, index, per_member * len(ms), per_member, index * per_member)
    weights = list(speeds) if speeds is not None and len(ms) <= SLOTS else [0.0] * len(ms)
    sizes = split(global_batch, weights[: len(ms)] + [0.0] * (len(ms) - len(weights)))
    return Shard(step, ms, index, global_batch, sizes[index], sum(sizes[:index]))
