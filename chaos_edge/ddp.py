"""Elastic DDP: a ``DistributedDataParallel`` script on Chaos, with a few lines changed.

    from chaos_edge import ddp

    model = ddp.DistributedDataParallel(Net())    # was: init_process_group(); DDP(Net())
    optimizer = torch.optim.AdamW(model.parameters())
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, 0.01, total_steps=total)
    trainer = ddp.elastic(model, optimizer, state={"sched": scheduler})   # joins the cluster
    while trainer.step < total:                  # was: for step in range(total)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()          # the elastic all-reduce runs in here
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)   # on the average, as in DDP
        optimizer.step()
        scheduler.step()

**How.** :class:`DistributedDataParallel` is torch's, over a private one-member gloo group (no
``init_process_group``, no fixed world), with a communication hook in place of DDP's
all-reduce. DDP hands the hook its gradient buckets as backward fills them. At the first one
the hook starts one Chaos round (:meth:`Trainer.update`: the agreement, the tree all-reduce and the
commit protocol, reruns after a failure included) on a thread of its own, and feeds it each
bucket as it comes: the round sends every chunk of the gradient as soon as backward has
produced it (the round vector puts the last parameters first, as backward produces them). At
the last bucket the hook waits for the round to commit, and every bucket gets the committed
average. A rerun after a failure waits for the whole gradient; nothing is applied to ``.grad``
while backward still writes it. So when ``backward()`` returns,
``.grad`` holds the members' average, exactly as after a DDP backward, and the script's own
clipping, ``GradScaler`` and ``optimizer.step()`` run unchanged on every member alike.

**Step boundaries.** Membership changes only between steps. The next training forward pass is
the step boundary (the step's ``optimizer.step()`` and ``scheduler.step()`` are done by then):
there the worker serves its state to a joining node, writes its durable snapshot, and, after a
``chaosctl leave``, Ctrl-C or SIGTERM, leaves gracefully and ends the script with exit status 0
(``SystemExit``). ``trainer.step`` is the cluster's step: a node that joins starts at it.

**What is replicated.** The module's parameters and buffers (buffers are averaged every step),
the optimizer, and what ``state=`` registers (schedulers, a ``GradScaler``, counters): the same
guarantees as the :class:`~chaos_edge.Trainer`.

**Supported:** ``no_sync()`` for gradient accumulation (the accumulated gradient is averaged
at the synchronised backward), ``find_unused_parameters``, ``static_graph``,
``gradient_as_bucket_view`` (on by default here: no copy between the gradients and DDP's
buckets), ``bucket_cap_mb``. **Not supported**, refused in one line: a
``process_group`` (Chaos forms the group), wrapping twice, FSDP or ``DataParallel`` inside,
``torch.distributed`` collectives of the script's own (there is no default group), diloco
sync, and calling ``optimizer.step()`` twice per backward.
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as TorchDDP

from chaos_edge.trainer import Trainer, TrainerError, capture_exit_event
from chaos_edge.trainer.overlap import BackgroundRound
from chaos_edge.trainer.stepper import refuse_step_arguments

__all__ = ["DistributedDataParallel", "elastic"]


def _solo_group() -> dist.ProcessGroup:
    """A gloo group of this process alone, outside ``torch.distributed``'s global state: DDP
    needs a group to build its reducer, and with one member it never talks to anyone."""
    store = dist.HashStore()
    pg = dist.ProcessGroup(store, 0, 1)
    backend = dist.ProcessGroupGloo(store, 0, 1, timedelta(seconds=60))
    for device in ("cpu", "cuda"):
        pg._register_backend(torch.device(device), dist.ProcessGroup.BackendType.GLOO, backend)
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return pg


def _wrapped_by(module: torch.nn.Module) -> str | None:
    """The data-parallel wrapper ``module`` already is, if any."""
    if isinstance(module, TorchDDP):
        return "DistributedDataParallel"
    if isinstance(module, torch.nn.DataParallel):
        return "DataParallel"
    for m in module.modules():
        name = type(m).__name__
        if name == "FullyShardedDataParallel" or name.startswith("FSDP"):
            return "FSDP"
    return None


class DistributedDataParallel(TorchDDP):
    """torch's ``DistributedDataParallel`` whose gradient all-reduce is Chaos's elastic round
    (module docstring). Takes DDP's keyword arguments but ``process_group``; the round runs
    once :func:`elastic` has joined the cluster.

    Raises:
        ValueError: ``module`` is already wrapped (DDP, DataParallel or FSDP), or a
            ``process_group`` is given.
    """

    def __init__(self, module: torch.nn.Module, **kwargs: Any) -> None:
        if "process_group" in kwargs:
            raise ValueError("process_group: Chaos forms the group of members itself; "
                             "drop the argument (and init_process_group)")
        wrapper = _wrapped_by(module)
        if wrapper is not None:
            raise ValueError(f"the module is already wrapped in {wrapper}: pass the bare "
                             "module to chaos_edge.ddp.DistributedDataParallel, once"
                             + (" (Chaos replicates the whole state; it cannot shard it)"
                                if wrapper == "FSDP" else ""))
        # The gradients live in DDP's buckets, so neither DDP nor the hook copies them.
        kwargs.setdefault("gradient_as_bucket_view", True)
        super().__init__(module, process_group=_solo_group(), **kwargs)
        self.chaos: _Hook | None = None  # set by elastic()


class _Hook:
    """The communication hook and the step boundary of one elastic DDP model."""

    def __init__(self, trainer: Trainer, model: DistributedDataParallel,
                 optimizer: torch.optim.Optimizer, overlap: bool) -> None:  # fmt: skip
        self.trainer, self.model, self.overlap = trainer, model, overlap
        self.pending: list[tuple[dist.GradBucket, torch.futures.Future[torch.Tensor]]] = []
        self.round: BackgroundRound | None = None  # the round beside this backward
        self.stepped_at = -1  # trainer.step at the last optimizer.step()
        model.register_comm_hook(self, _reduce)
        model.register_forward_pre_hook(self._boundary)
        optimizer.register_step_pre_hook(self._before_step)

    def bucket(self, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        """One bucket is ready: feed it to the round (started at the first one); at the last,
        wait for the round and complete every bucket with the committed average."""
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        self.pending.append((bucket, fut))
        if self.overlap:
            if self.round is None:
                self.round = BackgroundRound(self.trainer.grad_feed(),
                                             lambda feed: self.trainer.update(feed=feed))
            self.round.feed.ready(bucket.parameters())
        if not bucket.is_last():
            return fut
        done, self.pending = self.pending, []
        rnd, self.round = self.round, None
        try:
            if rnd is not None:
                rnd.join()  # .grad and the buffers now hold the average
            else:
                self.trainer.update()
        except BaseException as exc:
            for _, f in done:
                f.set_exception(exc)  # type: ignore[arg-type]  # torch's stub is wrong
            raise
        for b, f in done:
            # DDP copies each bucket's result back into .grad: hand it the average.
            for view, p in zip(b.gradients(), b.parameters(), strict=True):
                if p.grad is not None and p.grad.data_ptr() != view.data_ptr():
                    view.copy_(p.grad.reshape(view.shape))
            f.set_result(b.buffer())
        return fut

    def _boundary(self, _module: torch.nn.Module, _args: Any) -> None:
        """Before a training forward pass: the step boundary (module docstring)."""
        if not (torch.is_grad_enabled() and self.model.training):
            return
        self.trainer.check_state_replication()
        if capture_exit_event():
            self.trainer.request_node_exit()
            raise SystemExit(0)

    def _before_step(self, _opt: torch.optim.Optimizer, _args: Any, _kwargs: Any) -> None:
        step = self.trainer.step
        if step == self.stepped_at:
            raise TrainerError("optimizer.step() ran twice after one backward: call it once "
                               "per backward (accumulate with model.no_sync())")
        self.stepped_at = step


def _reduce(hook: _Hook, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    return hook.bucket(bucket)


# DDP checks the hook's annotations by value; under ``from __future__ import annotations``
# it would find the string.
_reduce.__annotations__.update(bucket=dist.GradBucket,
                               **{"return": torch.futures.Future[torch.Tensor]})


def elastic(model: DistributedDataParallel, optimizer: torch.optim.Optimizer, *,
            state: Mapping[str, Any] | None = None, overlap: bool = True,
            **trainer: Any) -> Trainer:
    """Join the cluster through the local chaosd and make ``model``'s backward elastic.

    Args:
        model: The :class:`DistributedDataParallel` model.
        optimizer: Its optimizer; the script steps it, once per backward.
        state: Everything else the run's state is made of (schedulers, a ``GradScaler``,
            counters), as :class:`~chaos_edge.Trainer` takes it.
        overlap: Run the round beside the backward pass, each chunk sent as soon as its
            gradients exist (False: once backward has produced them all). The result is
            the same bit for bit.
        trainer: Any other :class:`~chaos_edge.Trainer` argument (``samples_per_step``,
            ``global_batch``, ``timeout``, ...), but the optimizer step's own: ``scaler``,
            ``clip_grad_norm`` and ``grad_transform`` stay in the script.

    Returns:
        The :class:`~chaos_edge.Trainer` (``step``, ``shard``, ``node_id``, ...); its
        ``update()`` runs inside ``backward()``, so the script never calls it.

    Raises:
        ValueError: ``model`` is not a :class:`DistributedDataParallel`, is already elastic,
            the optimizer steps parameters the model does not have, or an argument above is
            given.
        ChaosError: as the :class:`~chaos_edge.Trainer` raises it.
    """
    if not isinstance(model, DistributedDataParallel):
        raise ValueError("wrap the model in chaos_edge.ddp.DistributedDataParallel (torch's "
                         "needs a fixed world of processes), then call elastic()")
    if model.chaos is not None:
        raise ValueError("this model is already elastic: call elastic() once")
    own = {id(p) for p in model.module.parameters()}
    if any(id(p) not in own for g in optimizer.param_groups for p in g["params"]):
        raise ValueError("the optimizer steps parameters that are not the model's: build "
                         "it from model.parameters()")
    refuse_step_arguments(trainer, "on the DDP path the script scales, clips and steps "
                          "itself, as under DDP; register a GradScaler in state=")
    t = Trainer(model.module, optimizer, state=state, step_optimizer=False, **trainer)
    model.chaos = _Hook(t, model, optimizer, overlap)
    atexit.register(t.close)
    return t
