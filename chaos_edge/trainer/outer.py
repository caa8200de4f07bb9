"""DiLoCo's outer loop: the synced parameters, the outer optimizer, the pseudo-gradient.

In ``diloco`` mode (:class:`~daemon.contracts.policy.SyncMode`, from "DiLoCo: Distributed
Low-Communication Training of Language Models") every member steps its own optimizer (the
*inner* one, the script's) on its own batches, and every ``inner_steps`` (H) steps the members
all-reduce the *pseudo-gradient* ``synced - current``: how far each moved from the parameters
of the last outer step, sample-weighted like a gradient. The *outer* optimizer (SGD, with
Nesterov momentum by default) steps the synced parameters with that average, and every member
loads the result into its model. So between outer steps the members' models differ; at each
outer step they become bit-identical again.

:class:`Outer` holds what every member agrees on: the synced parameters (float32, one flat
vector in the layout of the round's gradient segment), the outer momentum, and which H they
were made with. The inner optimizer's state (Adam's moments, say) stays each member's own, as
in DiLoCo: it is never averaged, compared or replicated. A joiner starts with a fresh inner
state from the synced parameters (docs/training-protocol.md, "Sync modes", says why).

In ``streaming`` mode ("Streaming DiLoCo with overlapping communication") the flat vector is
cut into ``fragments`` contiguous parts of (nearly) equal size, and each round syncs one of
them in turn: round ``k`` (at step ``k * period``, ``period = H / fragments``) syncs fragment
``k % fragments``, so every parameter still has an outer step every H steps, but a round
carries a ``fragments``-th of the bytes. Each fragment has its own window of samples. When a
fragment's outer step lands, the member's own value of it becomes
``merge * local + (1 - merge) * synced`` (``merge`` 0: the synced value, as in DiLoCo).
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import torch

from daemon.contracts.policy import SyncMode

SYNCED = "outer/synced"  # extra tensor: the synced parameters, when a model cannot hold them
MOMENTUM = "outer/momentum"  # extra tensor: the outer optimizer's momentum
COUNT = "outer/count"  # extra tensor: outer steps applied since the cluster entered diloco


def flat_params(params: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """The parameters as one flat float32 CPU vector (the round's gradient layout)."""
    parts = [p.detach().reshape(-1).to(device="cpu", dtype=torch.float32) for p in params]
    if not parts:
        return torch.zeros(0, dtype=torch.float32)
    return torch.cat(parts) if out is None else torch.cat(parts, out=out)


def outer_step(synced: torch.Tensor, momentum: torch.Tensor, avg: torch.Tensor,
               mode: SyncMode) -> None:
    """One outer step in place: ``torch.optim.SGD`` (dampening 0) on ``synced`` with the
    averaged pseudo-gradient ``avg`` as its gradient.

    ``m = mu * m + g``; the step is ``g + mu * m`` (Nesterov) or ``m``; ``synced -= lr * step``.
    Elementwise float32 arithmetic in a fixed order: equal inputs give bit-identical outputs
    on every member.
    """
    mu, lr = mode.outer_momentum, mode.outer_lr
    if mu == 0:
        synced.add_(avg, alpha=-lr)
        return
    momentum.mul_(mu).add_(avg)
    if mode.outer == "nesterov":
        synced.add_(avg.add(momentum, alpha=mu), alpha=-lr)
    else:
        synced.add_(momentum, alpha=-lr)


@contextlib.contextmanager
def inner_state_hidden(optimizer: torch.optim.Optimizer) -> Iterator[torch.optim.Optimizer]:
    """The optimizer as if its per-parameter state were empty (its hyper-parameters stay).

    A DiLoCo snapshot and digest hold the inner optimizer's hyper-parameters (schedulers move
    them alike on every member) but not its state, which is each member's own. Only the
    training thread touches the optimizer, so swapping its ``state`` here is safe.
    """
    saved = optimizer.state
    optimizer.state = defaultdict(dict)
    try:
        yield optimizer
    finally:
        optimizer.state = saved


class Outer:
    """The outer state of a member in ``diloco`` or ``streaming`` mode.

    Args:
        params: The model's parameters, in the Stepper's order.
        mode: The cluster's sync mode (H, and in ``streaming`` mode the fragments).
        origin: The step the mode took over at (its rounds fall ``period`` steps apart from
            it: ``chaos_edge.trainer.rhythm``).
        synced: The synced parameters (default: the parameters now).
        momentum: The outer momentum (default: zeros).
        count: Outer rounds the cluster applied so far (shared state: a round lost or
            applied twice anywhere shows in it).
    """

    def __init__(self, params: Sequence[torch.nn.Parameter], mode: SyncMode,
                 synced: torch.Tensor | None = None, momentum: torch.Tensor | None = None,
                 count: int = 0, origin: int = 0) -> None:  # fmt: skip
        self.params = list(params)
        self.origin = origin
        self.inner_steps, self.fragments, self.period = (mode.inner_steps, mode.fragments,
                                                         mode.period)
        self.synced = flat_params(self.params) if synced is None else synced.clone()
        self.momentum = torch.zeros_like(self.synced) if momentum is None else momentum.clone()
        if self.momentum.shape != self.synced.shape:
            raise ValueError("outer momentum and synced parameters differ in size")
        # A float32 CPU model holds the synced parameters exactly: a snapshot need not
        # carry them twice. Any other dtype rounds them, so they travel as their own tensor.
        self.exact = all(p.dtype == torch.float32 and p.device.type == "cpu"
                         for p in self.params)  # fmt: skip
        n = self.synced.numel()
        self.bounds = [(f * n // self.fragments, (f + 1) * n // self.fragments)
                       for f in range(self.fragments)]  # fmt: skip
        # This member's samples since each fragment's last outer step (its window).
        self.windows = [0] * self.fragments
        self.count = count
        self._scratch: torch.Tensor | None = None

    def outer_round(self, step: int) -> bool:
        """Whether ``step`` ends with a round (made by ``update()`` at ``step - 1``)."""
        return (step - self.origin) % self.period == 0

    def _slot(self, step: int) -> int:
        """The fragment the round of ``step`` syncs (0 but in ``streaming`` mode)."""
        return (step - self.origin) // self.period % self.fragments

    def fragment(self, step: int) -> tuple[int, int]:
        """The ``[lo, hi)`` slice of the flat parameters that the round of ``step`` syncs."""
        return self.bounds[self._slot(step)]

    def add_samples(self, n: int) -> None:
        """An inner step on ``n`` samples: it counts in every fragment's window."""
        self.windows = [w + n for w in self.windows]

    def samples(self, step: int) -> int:
        """This member's samples behind the pseudo-gradient of the round of ``step``."""
        return self.windows[self._slot(step)]

    def pseudo_gradient(self, step: int, out: torch.Tensor) -> None:
        """Write ``synced - current`` of the round of ``step``'s fragment into ``out``."""
        if self._scratch is None or self._scratch.shape != self.synced.shape:
            self._scratch = torch.empty_like(self.synced)
        lo, hi = self.fragment(step)
        current = flat_params(self.params, out=self._scratch)
        torch.sub(self.synced[lo:hi], current[lo:hi], out=out)

    def step(self, step: int, avg: torch.Tensor | None, mode: SyncMode) -> None:
        """Apply the averaged pseudo-gradient of the committed round of ``step`` (None: no
        member had samples, the synced values stand) to its fragment, merge the result into
        the model, and open the fragment's next window."""
        lo, hi = self.fragment(step)
        if avg is not None:
            outer_step(self.synced[lo:hi], self.momentum[lo:hi], avg, mode)
        self.load(lo, hi, mode.merge if mode.mode == "streaming" else 0.0)
        self.windows[self._slot(step)] = 0
        self.count += 1

    def load(self, lo: int = 0, hi: int | None = None, merge: float = 0.0) -> None:
        """Copy the synced values of ``[lo, hi)`` (default: all) into the model, keeping a
        ``merge`` share of each member's own value."""
        hi = self.synced.numel() if hi is None else hi
        at = 0
        with torch.no_grad():
            for p in self.params:
                n = p.numel()
                a, b = max(lo, at), min(hi, at + n)
                if a < b:
                    src = self.synced[a:b].to(dtype=p.dtype, device=p.device)
                    dst: torch.Tensor
                    if b - a == n:  # the whole tensor: any layout
                        dst, src = p, src.view_as(p)
                    else:
                        dst = p.view(-1)[a - at : b - at]
                    if merge:
                        dst.mul_(merge).add_(src, alpha=1 - merge)
                    else:
                        dst.copy_(src)
                at += n

    def model_state(self, model: torch.nn.Module, state: Mapping[str, torch.Tensor]
                    ) -> dict[str, torch.Tensor]:  # fmt: skip
        """``state`` (the model's state dict, buffers as agreed) with every parameter replaced
        by its synced value: what the members share mid-window."""
        views: dict[int, torch.Tensor] = {}
        at = 0
        for p in self.params:
            n = p.numel()
            views[id(p)] = self.synced[at : at + n].view(p.shape).to(dtype=p.dtype)
            at += n
        live = model.state_dict(keep_vars=True)
        return {k: views.get(id(live.get(k)), v) for k, v in state.items()}

    def tensors(self) -> list[tuple[str, torch.Tensor]]:
        """The outer state's own tensors, for snapshots and the divergence guard."""
        extra = [(MOMENTUM, self.momentum),
                 (COUNT, torch.tensor([self.count], dtype=torch.int64))]
        if not self.exact:
            extra.append((SYNCED, self.synced))
        return extra

    @classmethod
    def restore(cls, params: Sequence[torch.nn.Parameter], mode: SyncMode,
                extra: Mapping[str, Any], origin: int = 0) -> Outer:  # fmt: skip
        """The outer state of a replicated snapshot (the model already holds its parameters)."""
        synced = extra.get(SYNCED)
        return cls(params, mode, synced=synced, momentum=extra[MOMENTUM],
                   count=int(extra[COUNT][0]), origin=origin)
