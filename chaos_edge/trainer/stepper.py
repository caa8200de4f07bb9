"""Between the all-reduce and the step: what one round reduces, and how its result is applied.

One flat float32 vector per round, laid out as

    [ gradients | buffers | live | speeds ]

- *gradients*: every parameter's ``.grad`` (zeros where a parameter got none), upcast to
  float32 exactly; the result goes back in each gradient's own dtype and device. The last
  parameter comes first: backward produces the gradients in about that order, so a round that
  overlaps the backward pass (:class:`GradFeed`, :mod:`chaos_edge.ddp`) can send the front of
  the vector while the rest is still being computed.
- *buffers* (``buffers="average"``, the default): floating buffers (BatchNorm's running mean
  and variance) are averaged, weighted by samples like the gradients; integer buffers
  (``num_batches_tracked``) send their change since the last round, whose average is rounded
  and added to the agreed value, so they stay exact however large they grow. We average rather
  than broadcast from one member (DDP's ``broadcast_buffers``): averaging costs no extra round,
  it uses every member's batches, and a running mean averaged over members is exactly the
  running mean of the global batch (the update is linear). With ``buffers="local"`` each member
  keeps its own buffers, and the divergence guard leaves them out.
- *live*: 1.0 from every member; the average is 0 only when no member had samples (a round of
  leavers), and then buffers keep their agreed values instead of becoming zeros.
- *speeds* (consistent mode only): each member's measured samples/s in its slot, for the
  shares of the next global batch (:mod:`chaos_edge.trainer.shares`).

Only the gradients (the first :attr:`Stepper.n_grad` values) travel in the cluster's wire
format (``[training] wire``: fp16, bf16 or int8 compress them, see
:mod:`chaos_edge.dataplane.codec`); buffers, the live flag and the speeds always travel as exact
float32, because integer counters and the shares must come out exact on every member.

Every member applies the same result in the same order: unscale (GradScaler), the script's
``grad_transform``, global-norm clipping, the optimizer step (skipped by the scaler on an inf
or NaN, which the average carries to every member), then ``scaler.update()``. So members that
were identical stay identical, and a skipped step is skipped everywhere.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import torch

from chaos_edge.dataplane import InputFeed
from chaos_edge.dataplane.tensors import flatten_grads, unflatten_into
from chaos_edge.trainer.shares import SLOTS
from daemon.contracts.clock import Clock, SystemClock

BufferMode = Literal["average", "local"]
GradTransform = Callable[[Sequence[torch.nn.Parameter]], None]

#: The ``Trainer`` arguments that belong to the optimizer step it runs (``step_optimizer``).
STEP_ARGUMENTS = ("scaler", "clip_grad_norm", "grad_transform", "step_optimizer")


def refuse_step_arguments(given: Mapping[str, Any], why: str) -> None:
    """Refuse :data:`STEP_ARGUMENTS` in ``given`` in one line that names the first, where the
    script or a framework runs the optimizer step itself; ``why`` says who does, and where
    its own options are."""
    for key in STEP_ARGUMENTS:
        if key in given:
            raise ValueError(f"{key}: {why}")


class Stepper:
    """The round vector's layout and the step that applies a result.

    Args:
        model: The model.
        optimizer: Its optimizer.
        buffers: ``"average"`` or ``"local"`` (see the module docstring).
        scaler: A ``torch.amp.GradScaler`` the script scales its loss with, or None.
        clip_grad_norm: Max global L2 norm of the averaged gradient, or None.
        grad_transform: Called with the parameters after unscaling, before clipping.
        speeds: Whether the vector carries the speed slots (consistent mode).
        steps: Whether applying a result steps the optimizer. False on the DDP path
            (:mod:`chaos_edge.ddp`): the averaged gradient is left in ``.grad`` and the
            script's own ``optimizer.step()`` follows, as after a DDP backward.
        clock: What :meth:`step` is timed with (the stall bench reports the framework's
            own overhead apart from the optimizer's).
    """

    def __init__(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
        buffers: BufferMode = "average", scaler: Any = None,
        clip_grad_norm: float | None = None, grad_transform: GradTransform | None = None,
        speeds: bool = False, steps: bool = True, clock: Clock | None = None,
    ) -> None:  # fmt: skip
        if buffers not in ("average", "local"):
            raise ValueError(f"buffers must be 'average' or 'local', not {buffers!r}")
        if clip_grad_norm is not None and not clip_grad_norm > 0:
            raise ValueError(f"clip_grad_norm must be > 0, not {clip_grad_norm!r}")
        self.model, self.optimizer = model, optimizer
        self._clock = clock or SystemClock()
        self._step_s = 0.0  # time in step() since take_step_s() last read it
        if not steps and (scaler is not None or clip_grad_norm is not None
                          or grad_transform is not None):
            raise ValueError("scaler, clip_grad_norm and grad_transform act in the optimizer "
                             "step, which the script runs itself here: do them in the script")
        self.mode, self.scaler, self.steps = buffers, scaler, steps
        self.stepping = False  # inside step(): the optimizer's own step is ours
        self.clip, self.transform = clip_grad_norm, grad_transform
        self.params = list(model.parameters())
        self.order = self.params[::-1]  # the gradients' layout in the vector (module docstring)
        persistent = model.state_dict(keep_vars=True)
        named = dict(model.named_buffers())
        # state-dict name -> buffer tensor, for the buffers that are averaged
        self.buffers: dict[str, torch.Tensor] = {}
        if buffers == "average":
            for k, b in persistent.items():
                if any(b is v for v in named.values()) and (b.is_floating_point() or
                                                            _is_int(b)):  # fmt: skip
                    self.buffers[k] = b
        self.synced = {k: b.detach().clone() for k, b in self.buffers.items()}
        self.n_grad = sum(p.numel() for p in self.params)
        self.n_buf = sum(b.numel() for b in self.buffers.values())
        self.live_at = self.n_grad + self.n_buf
        self.speeds_at = self.live_at + 1
        self.size = self.speeds_at + (SLOTS if speeds else 0)
        # Reused every step: the input and the result (a fresh buffer the size of the model
        # per step cost a quarter of the CPU of a 100 MB round).
        self.flat = torch.zeros(self.size, dtype=torch.float32)
        self.result = torch.empty(self.size, dtype=torch.float32)
        # The result's gradients can be the parameters' .grad as they are (_point_grads).
        self._grads_view = all(p.device.type == "cpu" and p.dtype == torch.float32
                               and p.layout == torch.strided for p in self.params)

    def gather(self, slot: int | None = None, speed: float = 0.0, samples: int = 0,
               grads: bool = True) -> torch.Tensor:
        """This member's input to the round (written into :attr:`flat`).

        Args:
            slot: This member's speed slot (consistent mode), or None.
            speed: Its measured samples/s (0: unknown).
            samples: The samples of this round (the speed is sent as ``speed / samples``,
                because the round multiplies every value by the sample count).
            grads: False: leave the gradients' segment alone (a :class:`GradFeed` fills it).
        """
        if grads:
            flatten_grads(self.order, out=self.flat[: self.n_grad])
        at = self.n_grad
        for k, b in self.buffers.items():
            n = b.numel()
            src = b.detach() - self.synced[k] if _is_int(b) else b.detach()
            self.flat[at : at + n].copy_(src.reshape(-1).to(device="cpu", dtype=torch.float32))
            at += n
        self.flat[self.live_at] = 1.0
        if self.size > self.speeds_at:
            self.flat[self.speeds_at :] = 0.0
            if slot is not None and samples > 0 and speed > 0:
                self.flat[self.speeds_at + slot] = speed / samples
        return self.flat

    def speeds(self, values: torch.Tensor, lead: int | None = None) -> torch.Tensor | None:
        """The speed slots of a result (relative speeds of the members), if carried.
        ``lead``: the length of the result's gradients' segment, if not :attr:`n_grad` (a
        streaming round carries one fragment)."""
        at = self.speeds_at + self._shift(lead)
        if values.numel() <= at:
            return None
        return values[at:].clone()

    def live(self, values: torch.Tensor, lead: int | None = None) -> bool:
        """Whether any member had samples in the round of ``values`` (``lead``: as for
        :meth:`speeds`)."""
        return float(values[self.live_at + self._shift(lead)]) > 0

    def _shift(self, lead: int | None) -> int:
        return 0 if lead is None else lead - self.n_grad

    def apply(self, values: torch.Tensor) -> None:
        """Apply a committed result: gradients, buffers, then the step (module docstring),
        unless the script steps (:attr:`steps` False)."""
        if self.steps and self._grads_view:
            self._point_grads(values)
        else:
            unflatten_into(values[: self.n_grad], self.order)
        self.apply_buffers(values)
        if self.steps:
            self.step()

    def _point_grads(self, values: torch.Tensor) -> None:
        """Make each ``.grad`` a view of the result: the step reads the average where the
        round wrote it, with no copy of the model's size (a copy of 100 MB costs about
        12 ms a step on a small box). The step then drops the views (``set_to_none``), so
        the next round may reuse the buffer."""
        at = 0
        for p in self.order:
            n = p.numel()
            p.grad = values[at : at + n].view_as(p)
            at += n

    def apply_buffers(self, values: torch.Tensor, lead: int | None = None) -> None:
        """Take the buffers of a committed result (a DiLoCo outer round has no inner step;
        ``lead``: as for :meth:`speeds`)."""
        if self.buffers and self.live(values, lead):
            at = self.n_grad + self._shift(lead)
            with torch.no_grad():
                for k, b in self.buffers.items():
                    n = b.numel()
                    avg = values[at : at + n].view(b.shape)
                    if _is_int(b):
                        self.synced[k] += torch.round(avg).to(b.dtype).to(self.synced[k].device)
                    else:
                        self.synced[k].copy_(avg.to(dtype=b.dtype))
                    b.copy_(self.synced[k].to(b.device))
                    at += n
        elif self.buffers:  # nobody had samples: the agreed values stand
            with torch.no_grad():
                for k, b in self.buffers.items():
                    b.copy_(self.synced[k].to(b.device))

    def step(self) -> None:
        """The optimizer step on the gradients the parameters hold: unscale, transform,
        clip, step (through the scaler), zero the gradients."""
        t0 = self._clock.monotonic()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        if self.transform is not None:
            self.transform(self.params)
        if self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self.stepping = True
        try:
            if self.scaler is not None:
                self.scaler.step(self.optimizer)
                self.scaler.update()
            else:
                self.optimizer.step()
        finally:
            self.stepping = False
        self.optimizer.zero_grad(set_to_none=True)
        self._step_s += self._clock.monotonic() - t0

    def take_step_s(self) -> float:
        """Seconds spent in :meth:`step` since the last call (one ``update()``'s worth)."""
        spent, self._step_s = self._step_s, 0.0
        return spent

    def model_state(self) -> dict[str, torch.Tensor]:
        """The model's state dict as agreed at the last step: averaged buffers come from the
        synchronised copy, since a forward pass since then has changed the live ones."""
        sd = self.model.state_dict()
        return {k: self.synced.get(k, v) for k, v in sd.items()}

    def digest_state(self) -> dict[str, torch.Tensor]:
        """What the divergence guard compares of the model: with local buffers, the
        parameters only (buffers differ between members by design)."""
        sd = self.model_state()
        if self.mode == "local":
            names = {k for k, _ in self.model.named_parameters()}
            return {k: v for k, v in sd.items() if k in names}
        return sd

    def restored(self) -> None:
        """The model was just loaded from a replicated state: its buffers are the agreed ones."""
        for k, b in self.buffers.items():
            self.synced[k] = b.detach().clone()


def _is_int(t: torch.Tensor) -> bool:
    return not t.is_floating_point() and not t.is_complex() and t.dtype != torch.bool


class GradFeed:
    """The gradients' segment of a round's input, filled while backward runs.

    ``ready(params)`` copies those parameters' gradients into the vector and advances the
    round's :class:`~chaos_edge.dataplane.InputFeed` over every leading parameter that is in,
    so the data plane sends each chunk as soon as its gradients exist. Parameters ready out
    of the layout's order still count; they just let the front advance later.
    ``finish()`` copies whatever is left (parameters no bucket carried).
    """

    def __init__(self, stepper: Stepper) -> None:
        self.stepper = stepper
        self.feed = InputFeed(stepper.n_grad)
        self._at: dict[int, tuple[int, torch.nn.Parameter]] = {}
        lo = 0
        for p in stepper.order:
            self._at[id(p)] = (lo, p)
            lo += p.numel()
        self._done: set[int] = set()
        self._front = 0  # index into stepper.order of the first parameter not yet in
        self._upto = 0

    def ready(self, params: Sequence[torch.Tensor]) -> None:
        """These parameters' gradients are final (a DDP bucket is ready)."""
        flat = self.stepper.flat
        for p in params:
            lo, param = self._at[id(p)]
            if id(p) in self._done:
                continue
            n = param.numel()
            if param.grad is None:
                flat[lo : lo + n].zero_()
            else:
                flat[lo : lo + n].copy_(param.grad.detach().reshape(-1))
            self._done.add(id(p))
        order = self.stepper.order
        while self._front < len(order) and id(order[self._front]) in self._done:
            self._upto += order[self._front].numel()
            self._front += 1
        self.feed.advance(self._upto)

    def has(self, param: torch.Tensor) -> bool:
        """Whether ``param``'s gradient is in already (a second backward would change it)."""
        return id(param) in self._done

    def finish(self) -> None:
        """Every gradient is final: copy the ones no bucket carried."""
        self.ready([p for p in self.stepper.order if id(p) not in self._done])
