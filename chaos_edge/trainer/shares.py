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

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from daemon.contracts.policy import SyncPolicy

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


class Shares:
    """This member's shares of the steps, and the speed they follow in consistent mode.

    Args:
        me: This node's id.
        per_member: Samples behind one member's gradient without a global batch.
        global_batch: The fixed global batch (consistent mode), or None.
    """

    def __init__(self, me: str, per_member: int, global_batch: int | None) -> None:
        self.me, self.per_member, self.global_batch = me, per_member, global_batch
        self.speed = 0.0  # our samples/s (smoothed)
        # The members' speeds from the last round we committed, and whose slots they are
        # (that round's members, sorted): the layout of the speeds, not the policy version.
        # Keyed by the version, a member that had not yet heard a newer policy of the same
        # members (a re-chunk or a new tree) when it read its shard would split its step by
        # the speeds while those that had heard it split evenly, and the shards would overlap.
        self._speeds: tuple[tuple[str, ...], list[float]] | None = None
        self._shard: Shard | None = None  # the last one handed out
        self._last_end: float | None = None  # when the last update() returned

    def shard(self, step: int, pub: SyncPolicy | None) -> Shard:
        """Our shard of ``step`` under ``pub`` (the policy of that round, else the newest)."""
        members = pub.members if pub is not None and self.me in pub.members else (self.me,)
        speeds = None
        if pub is not None and self._speeds is not None and \
                self._speeds[0] == tuple(sorted(members)):
            speeds = self._speeds[1]
        self._shard = shard_of(step, members, self.me, per_member=self.per_member,
                               global_batch=self.global_batch, speeds=speeds)  # fmt: skip
        return self._shard

    def samples(self, step: int, pub: Callable[[], SyncPolicy | None]) -> int:
        """The samples behind our gradient of ``step`` when the script names none: our shard's
        (the one it read, else ``pub()``'s), or ``per_member`` without a global batch."""
        if self.global_batch is None:
            return self.per_member
        if self._shard is not None and self._shard.step == step:
            return self._shard.size
        return self.shard(step, pub()).size

    def began(self, now: float, n: int) -> None:
        """An ``update()`` with ``n`` samples began: our compute speed is ``n`` over the time
        since the last one returned (smoothed)."""
        if self._last_end is not None and n > 0 and now > self._last_end:
            seen = n / (now - self._last_end)
            self.speed = seen if not self.speed else (
                (1 - SPEED_EMA) * self.speed + SPEED_EMA * seen)

    def ended(self, now: float) -> None:
        """The ``update()`` returned."""
        self._last_end = now

    def slot(self, pub: SyncPolicy) -> int | None:
        """Our speed slot in a round under ``pub`` (None: none, or not consistent mode)."""
        if self.global_batch is None:
            return None
        index = sorted(pub.members).index(self.me)
        return index if index < SLOTS else None

    def committed(self, members: Sequence[str] | None, speeds: torch.Tensor | None) -> None:
        """A round of ``members`` committed their ``speeds`` (its slots; None: unknown).

        Every member of the next round holds the same speeds when its members are the same:
        all of them committed this round together, and one that did not (a joiner) restored
        a state since, which forgets them (:meth:`forget`)."""
        if self.global_batch is not None:
            self._speeds = None if speeds is None or members is None else (
                tuple(sorted(members)), speeds.tolist())

    def forget(self) -> None:
        """A replicated state replaced ours: the speeds and shard we knew are from before."""
        self._speeds, self._shard = None, None
