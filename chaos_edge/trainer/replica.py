"""This member's replica of the run's state, and what a committed round does to it.

:class:`Replica` holds the state that the members keep bit-identical: the model and optimizer,
the registered objects (:mod:`~chaos_edge.trainer.objects`), the last committed step, the
result of round ``step + 1`` while its commit is uncertain (*held*), and in ``diloco`` mode the
outer state (:mod:`~chaos_edge.trainer.outer`). The Trainer's collaborators see it through
narrow views: the joiner restores it, a source snapshots it, the divergence guard digests it,
and every committed round moves it on.

**diloco mode.** Under a policy whose ``sync`` is ``diloco`` every ``update()`` steps the
script's optimizer on the local gradient (the inner step; no collective), and every
``inner_steps``-th ``update()`` then runs a round through the same agreement, all-reduce and
commit as ``every-step`` mode: its input is the pseudo-gradient ``synced - current`` weighted
by the samples this member saw since the last outer step, plus the buffers (averaged as every
step in ``every-step`` mode), and its committed result is applied by the outer optimizer.
What members share mid-window, and so what the divergence guard compares and a new node
receives, is the outer state: the synced parameters, the agreed buffers, the outer momentum,
the inner optimizer's hyper-parameters and the registered objects (:meth:`Replica._shared`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from chaos_edge.replication.state import Loaded, StateSpace, state_digest_bytes, tensor_bytes
from chaos_edge.trainer.control import TrainerError
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.outer import Outer, inner_state_hidden
from chaos_edge.trainer.rhythm import Rhythm
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.policy import SyncMode, SyncPolicy

Extra = list[tuple[str, torch.Tensor]]


class Replica:
    """The state this member holds, as every member holds it at a step.

    Args:
        model: The model.
        optimizer: The script's optimizer (the inner one in diloco mode).
        objects: The registered objects.
        stepper: The round vector's layout and the step that applies a result.

    Attributes:
        step: The last committed step (``trainer.step``).
        held: The result of round ``step + 1`` when its commit is uncertain (an abort after
            the result was in), else None; the next agreement settles it.
        held_version: The policy version of the round that produced :attr:`held`.
        held_mode: That policy's sync mode, kept with the result: by the time the next
            agreement commits it, the policy may be forgotten (a book keeps the newest few).
        outer: The outer state in diloco mode, else None.
        rhythm: The sync mode in force and where its rounds fall (the data plane's round
            numbers), part of the shared state.
    """

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                 objects: Registry, stepper: Stepper) -> None:  # fmt: skip
        self.model, self.optimizer = model, optimizer
        self.objects, self.stepper = objects, stepper
        self.step = 0
        self.held: Any = None
        self.held_version = -1
        self.held_mode: SyncMode | None = None
        self.outer: Outer | None = None
        self.rhythm = Rhythm()
        # Waits until no backward pass is writing gradients (a round beside backward,
        # :mod:`~chaos_edge.trainer.overlap`): every write of the model below calls it first.
        self.settled: Callable[[], None] = lambda: None

    # -- rounds ----------------------------------------------------------------------------
    def round_step(self) -> int:
        """The data plane's step: the number of the last committed round."""
        return self.rhythm.round_at(self.step)

    def last_round_step(self) -> int:
        """The step of our last round: the last step, or the last outer round."""
        return self.rhythm.last_round_step(self.step)

    def inner_step(self, pub: SyncPolicy, n: int) -> bool:
        """In ``diloco`` mode, this ``update()``'s inner step; True if no round follows it
        (:attr:`step` has moved on), False if this is an outer round (or every-step mode).

        The mode is the replica's own (:attr:`rhythm`), which a committed round switches; a
        run that has committed nothing yet starts in ``pub``'s.

        Raises:
            TrainerError: A mode this worker cannot follow (see the messages).
        """
        if self.step == 0 and self.rhythm.anchor_step == 0 and self.rhythm.mode != pub.sync:
            self._switch(pub.sync)  # nothing ran yet: the run starts in the cluster's mode
        mode = self.rhythm.mode
        if not mode.diloco:
            return False
        why = self.cannot_step_locally()
        if why:
            raise TrainerError(why)
        self.settled()  # the inner step steps the model
        assert self.outer is not None
        if n > 0:
            self.stepper.step()  # clip, transform, the script's optimizer.step(), zero
        else:
            self.optimizer.zero_grad(set_to_none=True)  # a leaver's drain: nothing to step
        self.outer.add_samples(n)
        if self.rhythm.ends_round(self.step + 1):
            return False
        self.step += 1
        return True

    def cannot_step_locally(self) -> str:
        """Why this member cannot run DiLoCo's local steps ("" if it can): the scheduler's
        controller never switches a cluster with such a member into a diloco mode."""
        if not self.stepper.steps:
            return ("diloco mode needs the Trainer to run the inner steps; the DDP path "
                    "(chaos_edge.ddp) runs every-step sync only: set [training] sync = "
                    "\"every-step\" in chaosd.toml")
        if self.stepper.scaler is not None:
            return ("diloco mode does not support a GradScaler (its scale would be each "
                    "member's own); drop scaler= or use every-step sync")
        return ""

    def round_samples(self, n: int) -> int:
        """Samples behind this round's input: the window's in diloco mode."""
        return n if self.outer is None else self.outer.samples(self.step + 1)

    def lead(self) -> int:
        """The length of the gradients' segment of round ``step + 1``'s vector."""
        if self.outer is None:
            return self.stepper.n_grad
        lo, hi = self.outer.fragment(self.step + 1)
        return hi - lo

    def lane(self) -> int:
        """The round ``step + 1``'s lane: its fragment in streaming mode, else 0 (the data
        plane keeps each lane's int8 error feedback apart)."""
        if self.outer is None:
            return 0
        return self.rhythm.index(self.step + 1) % self.outer.fragments

    def round_input(self, flat: torch.Tensor, n: int) -> tuple[torch.Tensor, int]:
        """The round's input and how many of its leading values are the gradients' segment
        (those travel in the wire format). Every-step: ``flat`` as gathered; diloco: the
        pseudo-gradient in that segment; streaming: the pseudo-gradient of the round's
        fragment, then the rest of ``flat`` (buffers, live flag, speeds)."""
        out, grads = self.outer, self.stepper.n_grad
        if out is None:
            return flat, grads
        step = self.step + 1
        lo, hi = out.fragment(step)
        if hi - lo == grads:
            if n:
                out.pseudo_gradient(step, flat[:grads])
            return flat, grads
        vec = torch.empty(hi - lo + flat.numel() - grads, dtype=flat.dtype)
        if n:
            out.pseudo_gradient(step, vec[: hi - lo])
        else:
            vec[: hi - lo].zero_()
        vec[hi - lo :].copy_(flat[grads:])
        return vec, hi - lo

    def commit(self, values: torch.Tensor, mode: SyncMode) -> None:
        """Apply the committed result of round ``step + 1``; ``mode`` is the sync mode of the
        policy it ran under. The round follows the replica's mode; a policy of another mode
        switches to it once the round is in (:meth:`_switch`), at the same step on every
        member, since each commits the same round under the same policy."""
        self.settled()
        if self.outer is None:
            self.stepper.apply(values)
        else:
            # The agreed buffers, then the outer step of the round's fragment (skipped when
            # no member had samples) and the synced values into the model.
            step = self.step + 1
            lo, hi = self.outer.fragment(step)
            self.stepper.apply_buffers(values, lead=hi - lo)
            live = self.stepper.live(values, lead=hi - lo)
            self.outer.step(step, values[: hi - lo] if live else None, mode)
            self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        self.held = None
        if mode != self.rhythm.mode:
            self._switch(mode)

    def _switch(self, mode: SyncMode) -> None:
        """Follow ``mode`` from this step (a round boundary) on, from a state every member
        holds alike.

        Leaving a diloco mode, the members' own parameters differ (streaming: in every
        fragment but the one just synced), so each takes the synced ones, as a joiner does;
        entering every-step, the inner optimizer's state, each member's own, starts afresh
        (Adam's moments, as a joiner's), so that the members hold one state again. Between
        diloco modes the outer momentum and count carry over; entering one, the parameters
        now are the synced ones.
        """
        was, self.rhythm = self.rhythm, self.rhythm.switched(mode, self.step)
        old = self.outer
        if was.same_rounds(mode):
            return
        if old is not None:
            self.settled()
            old.load()
        if not mode.diloco:
            self.outer = None
            if old is not None:
                self.optimizer.state.clear()
            return
        self.outer = Outer(self.stepper.params, mode, origin=self.step,
                           synced=None if old is None else old.synced,
                           momentum=None if old is None else old.momentum,
                           count=0 if old is None else old.count)

    # -- the shared state ------------------------------------------------------------------
    @contextlib.contextmanager
    def _shared(self, model_state: dict[str, torch.Tensor], extra: Extra
                ) -> Iterator[tuple[torch.optim.Optimizer, dict[str, torch.Tensor], Extra]]:
        """The state every member holds alike: as given in every-step mode; in diloco mode
        the outer state in place of the live parameters and the inner optimizer's state."""
        if self.outer is None:
            yield self.optimizer, model_state, extra
            return
        with inner_state_hidden(self.optimizer) as opt:
            yield (opt, self.outer.model_state(self.model, model_state),
                   [*extra, *self.outer.tensors()])

    def digest(self) -> bytes:
        """SHA-256 of the shared state (what the divergence guard compares), the mode in
        force and its anchor included."""
        tensors, doc = self.objects.capture()
        meta = {"objects": doc, "rhythm": self.rhythm.to_dict()}
        with self._shared(self.stepper.digest_state(), tensors) as (opt, state, extra):
            return state_digest_bytes(self.model, opt, model_state=state, extra=extra,
                                      meta=meta)  # fmt: skip

    def local_bytes(self) -> int:
        """Bytes of the model's, the optimizer's and the objects' tensors: what a snapshot
        copies (the memory guard), and whether probing the links pays (a join)."""
        tensors, _ = self.objects.capture()
        return tensor_bytes(self.model, self.optimizer, tensors)

    def snapshot(self, hashed: bool = True) -> StateSpace:
        """The state a source serves a new node, at this step boundary.

        A held result travels with it: the new node is then as uncertain about round
        ``step + 1`` as we are, and the first agreement settles it for both alike. In diloco
        mode it is the outer state, the same all window long, so sources at different steps
        of one window serve the same state. ``hashed=False`` leaves the block digests for
        later (:meth:`StateSpace.hashed`): a durable snapshot hashes off the step's path.
        """
        tensors, doc = self.objects.capture()
        runtime: dict[str, Any] = {"step": self.step, "objects": doc}
        if self.held is not None:
            tensors.append(("held", self.held))
            runtime["held_version"] = self.held_version
            if self.held_mode is not None:
                runtime["held_sync"] = self.held_mode.to_dict()
        runtime["rhythm"] = self.rhythm.to_dict()
        with self._shared(self.stepper.model_state(), tensors) as (opt, state, extra):
            return StateSpace.capture(self.model, opt, runtime, model_state=state, extra=extra,
                                      rng=False, hashed=hashed)  # fmt: skip

    def fit_error(self, loaded: Loaded) -> str | None:
        """What keeps a replicated state from loading here (one line), or None."""
        objects = loaded.runtime.get("objects", {})
        return (loaded.fit_error(self.model, self.optimizer)
                or self.objects.mismatch(objects, loaded.extra))  # fmt: skip

    def restore(self, loaded: Loaded) -> None:
        """Load a replicated state that fits (:meth:`fit_error`): model, optimizer, objects,
        the outer state, the step and the held result.

        Raises:
            StateMismatch: A registered object's ``load_state_dict`` refused its state.
        """
        self.settled()  # autograd may still hold the parameters it is differentiating
        runtime = loaded.runtime
        loaded.apply(self.model, self.optimizer)
        self.objects.restore(runtime.get("objects", {}), loaded.extra)
        self.stepper.restored()
        doc = runtime.get("rhythm")
        self.rhythm = Rhythm.from_dict(doc) if doc else Rhythm.legacy(runtime.get("outer"))
        mode = self.rhythm.mode
        self.outer = None if not mode.diloco else Outer.restore(
            self.stepper.params, mode, loaded.extra, origin=self.rhythm.anchor_step)
        self.step = int(runtime["step"])
        held = loaded.extra.get("held")
        self.held = None if held is None else held.clone()
        self.held_version = int(runtime.get("held_version", -1))
        doc = runtime.get("held_sync")
        self.held_mode = SyncMode.from_dict(doc) if doc else None  # older snapshots lack it

    def hold(self, result: Any, version: int, mode: SyncMode) -> None:
        """Keep round ``step + 1``'s result, whose commit is uncertain, for the next agreement."""
        self.held, self.held_version, self.held_mode = result, version, mode

    def start_alone(self) -> None:
        """Bootstrap from our own state: nobody is left to settle a held result with."""
        self.held = None

