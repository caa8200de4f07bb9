"""The Trainer's ``diloco`` mode: inner steps, the outer round's input and its application.

A mixin of :class:`~chaos_edge.trainer.api.Trainer` (the outer state itself is
:mod:`chaos_edge.trainer.outer`). Under a policy whose ``sync`` is ``diloco`` every ``update()``
steps the script's optimizer on the local gradient (the inner step; no collective), and every
``inner_steps``-th ``update()`` then runs a round through the same agreement, all-reduce and
commit as ``every-step`` mode: its input is the pseudo-gradient ``synced - current`` weighted
by the samples this member saw since the last outer step, plus the buffers (averaged as every
step in ``every-step`` mode), and its committed result is applied by the outer optimizer.

What members share mid-window, and so what the divergence guard compares and a new node
receives, is the outer state: the synced parameters, the agreed buffers, the outer momentum,
the inner optimizer's hyper-parameters and the registered objects (:meth:`_shared`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from chaos_edge.replication.state import StateSpace, state_digest_bytes
from chaos_edge.trainer.control import TrainerError
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.outer import Outer, inner_state_hidden
from chaos_edge.trainer.parts import TrainerParts
from daemon.contracts.policy import SyncMode, SyncPolicy

Extra = list[tuple[str, torch.Tensor]]


class LocalSteps(TrainerParts):
    """Inner steps and outer rounds (mixed into the Trainer)."""

    _outer: Outer | None
    _objects: Registry

    def _inner(self, pub: SyncPolicy, n: int) -> bool:
        """In ``diloco`` mode, this ``update()``'s inner step; True if no round follows it
        (``trainer.step`` has moved on), False if this is an outer round (or every-step mode).

        Raises:
            TrainerError: A mode this worker cannot follow (see the messages).
        """
        mode = pub.sync
        if not mode.diloco:
            if self._outer is not None:
                # Mid-window the members' parameters differ; every-step rounds would average
                # gradients of different models. Only a fresh start can switch back.
                raise TrainerError(f"the cluster's sync mode changed from diloco to "
                                   f"{mode.mode} at step {self.step + 1} (policy "
                                   f"v{pub.version}); restart the training to switch back")
            return False
        if self._stepper.scaler is not None:
            raise TrainerError("diloco mode does not support a GradScaler (its scale would "
                               "be each member's own); drop scaler= or use every-step sync")
        if self._outer is None:
            # Entering diloco: the parameters are agreed at this step boundary (a fresh
            # cluster, an every-step cluster switching, or a joiner's restored state).
            self._outer = Outer(self._stepper.params, mode.inner_steps)
        elif self._outer.inner_steps != mode.inner_steps:
            raise TrainerError(f"the cluster's inner_steps changed from "
                               f"{self._outer.inner_steps} to {mode.inner_steps} at step "
                               f"{self.step + 1}; restart the training to change it")
        if n > 0:
            self._stepper.step()  # clip, transform, the script's optimizer.step(), zero
        else:
            self.optimizer.zero_grad(set_to_none=True)  # a leaver's drain: nothing to step
        self._outer.samples += n
        if self._outer.outer_round(self.step + 1):
            return False
        self.step += 1
        return True

    def _round_samples(self, n: int) -> int:
        """Samples behind this round's input: the window's in diloco mode."""
        return n if self._outer is None else self._outer.samples

    def _round_input(self, flat: torch.Tensor, n: int) -> None:
        """Put the pseudo-gradient into the gradient segment of an outer round's input."""
        if self._outer is not None and n:
            self._outer.pseudo_gradient(flat[: self._stepper.n_grad])

    def _apply_outer(self, values: torch.Tensor, version: int) -> None:
        """Apply a committed outer round: the agreed buffers, then the outer step (skipped
        when no member had samples) and the synced parameters into the model."""
        assert self._outer is not None
        self._stepper.apply_buffers(values)
        if float(values[self._stepper.live_at]) > 0:
            self._outer.step(values[: self._stepper.n_grad], self._mode_of(version))
        else:
            self._outer.settle()
        self.optimizer.zero_grad(set_to_none=True)

    def _mode_of(self, version: int) -> SyncMode:
        """The sync mode of the policy a round ran under (the newest if it is forgotten)."""
        pub = self._s.book.get(version) or self._s.book.newest
        assert pub is not None
        return pub.sync

    def _last_round_step(self) -> int:
        """The step of our last round: the last step, or the last outer step."""
        if self._outer is None:
            return self.step
        return self.step // self._outer.inner_steps * self._outer.inner_steps

    @contextlib.contextmanager
    def _shared(self, model_state: dict[str, torch.Tensor], extra: Extra
                ) -> Iterator[tuple[torch.optim.Optimizer, dict[str, torch.Tensor], Extra]]:
        """The state every member holds alike: as given in every-step mode; in diloco mode
        the outer state in place of the live parameters and the inner optimizer's state."""
        if self._outer is None:
            yield self.optimizer, model_state, extra
            return
        with inner_state_hidden(self.optimizer) as opt:
            yield (opt, self._outer.model_state(self.model, model_state),
                   [*extra, *self._outer.tensors()])

    def _digest(self) -> bytes:
        tensors, doc = self._objects.capture()
        with self._shared(self._stepper.digest_state(), tensors) as (opt, state, extra):
            return state_digest_bytes(self.model, opt, model_state=state, extra=extra,
                                      meta=doc)  # fmt: skip

    def _snapshot(self, runtime: dict[str, Any], tensors: Extra) -> StateSpace:
        """The state a source serves a new node (see Serving)."""
        if self._outer is not None:
            runtime["outer"] = {"inner_steps": self._outer.inner_steps}
        with self._shared(self._stepper.model_state(), tensors) as (opt, state, extra):
            return StateSpace.capture(self.model, opt, runtime, model_state=state, extra=extra,
                                      rng=False)  # fmt: skip

    def _restore_outer(self, runtime: dict[str, Any], extra: dict[str, torch.Tensor]) -> None:
        """After a join: the outer state of the snapshot, if the cluster is in diloco mode."""
        doc = runtime.get("outer")
        self._outer = None if not doc else Outer.restore(
            self._stepper.params, int(doc["inner_steps"]), extra)
