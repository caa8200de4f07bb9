"""Elastic Lightning: a ``LightningModule`` trains on Chaos with one argument changed.

    import lightning.pytorch as pl
    from chaos_edge.lightning import ChaosStrategy

    trainer = pl.Trainer(strategy=ChaosStrategy(), max_steps=total)   # was: strategy="ddp"
    trainer.fit(module, datamodule)

Needs the ``lightning`` extra (``pip install 'chaos-edge[lightning]'``); start the script with
``chaosctl join -- python train.py`` on every box.

**How.** :class:`ChaosStrategy` is a one-device strategy whose optimizer step first averages
the gradients over the cluster's members: a Chaos round (the agreement, the tree all-reduce,
the commit protocol, reruns after a failure) runs between the backward pass and the optimizer
step, before Lightning's gradient clipping, so clipping, the precision plugin's scaler and the
optimizer see the members' average, as under DDP. With ``accumulate_grad_batches`` the round
runs once, at the step (the micro-batches accumulate locally).

**Step boundaries.** Membership changes only between steps. Before each training batch the
node serves its state to joiners and writes its durable snapshot. After a ``chaosctl leave``,
Ctrl-C or SIGTERM it leaves at the end of the batch and ``trainer.fit`` returns (Lightning's
own ``should_stop``, as early stopping uses it). ``max_steps`` counts the *cluster's* steps: a
node that joins at step 300 of 1000 trains 700 steps, and every member stops at the same one.

**What is replicated.** The module's parameters and buffers (buffers are averaged every step),
the optimizer, the LR schedulers, the precision plugin's ``GradScaler``, and whatever
``state=`` registers: the same guarantees as the :class:`~chaos_edge.Trainer`.

**Refused at setup, in one line naming the option:** more than one optimizer, ``min_steps``
and ``min_epochs`` (a leave could not stop the fit), ``ckpt_path`` (the cluster's state is the
one to resume: Chaos's snapshots restore it), and in manual optimization more than one
``optimizer.step()`` per batch. Epoch counters and ``trainer.global_step`` stay local.
"""

from __future__ import annotations

import atexit
from collections.abc import Callable, Mapping
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.strategies import SingleDeviceStrategy

from chaos_edge.trainer import Trainer, TrainerError, capture_exit_event
from chaos_edge.trainer.stepper import refuse_step_arguments

__all__ = ["ChaosStrategy"]


class ChaosStrategy(SingleDeviceStrategy):
    """Lightning's one-device strategy, with the gradients averaged over the cluster before
    each optimizer step (module docstring).

    Args:
        device: The device this node trains on (default: CUDA if there is one, else CPU).
        state: More of the run's state to replicate (counters, an EMA model...), as the
            :class:`~chaos_edge.Trainer` takes it; the LR schedulers and the scaler are
            registered already.
        trainer: Any other :class:`~chaos_edge.Trainer` argument (``samples_per_step``,
            ``global_batch``, ``timeout``, ...) but those of the optimizer step, which stays
            Lightning's: ``scaler``, ``clip_grad_norm`` (use ``gradient_clip_val``) and
            ``grad_transform``.

    Attributes:
        chaos: The :class:`~chaos_edge.Trainer`, once ``fit`` has joined the cluster
            (``step``, ``node_id``, ``shard``, ``state_digest()``...).
    """

    strategy_name = "chaos"

    def __init__(self, device: str | torch.device | None = None, *,
                 state: Mapping[str, Any] | None = None, **trainer: Any) -> None:
        refuse_step_arguments(trainer, "Lightning clips, scales and steps the optimizer; use "
                              "the pl.Trainer's options (gradient_clip_val, precision)")
        if device is None:
            device = "cuda" if torch.cuda.is_available() else "cpu"
        super().__init__(device=torch.device(device))
        self._extra = dict(state or {})
        self._kwargs = trainer
        self.chaos: Trainer | None = None
        self._stepped = False  # this batch has stepped the optimizer (manual optimization)

    def setup(self, trainer: pl.Trainer) -> None:
        super().setup(trainer)
        if self.chaos is not None or trainer.state.fn != "fit":
            return
        _refuse_what_cannot_be_elastic(trainer, self.optimizers)
        state: dict[str, Any] = {f"lr_scheduler_{i}": cfg.scheduler
                                 for i, cfg in enumerate(self.lr_scheduler_configs)}
        scaler = getattr(self.precision_plugin, "scaler", None)
        if scaler is not None:
            state["grad_scaler"] = scaler
        state.update(self._extra)
        assert self.lightning_module is not None
        self.chaos = Trainer(self.lightning_module, self.optimizers[0], state=state,
                             step_optimizer=False, **self._kwargs)
        atexit.register(self.chaos.close)

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """The step boundary: the last step, its LR schedulers included, is complete."""
        self._stepped = False
        if self.chaos is not None:
            self.chaos.check_state_replication()

    def optimizer_step(self, optimizer: Any, closure: Callable[[], Any],
                       model: Any = None, **kwargs: Any) -> Any:
        """Average the gradients once the closure's backward pass has produced them, then
        let Lightning clip and step; stop the fit after a leave or at ``max_steps``."""
        chaos = self.chaos
        if chaos is None:  # not fitting (cannot happen in Lightning 2): a plain step
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        if self._stepped:
            raise TrainerError("optimizer.step() ran twice in one batch: under Chaos each "
                               "batch steps once (the round averages one gradient)")

        def averaged() -> Any:
            result = closure()
            if result is None and self.lightning_module.automatic_optimization:
                # Lightning skips the step of a batch whose training_step returned None; the
                # other members would step without this one.
                raise TrainerError("training_step returned None: under Chaos every member "
                                   "steps at every step, so return a loss")
            chaos.update()  # .grad now holds the members' average
            return result

        self._stepped = True
        out = super().optimizer_step(optimizer, averaged, model, **kwargs)
        pl_trainer = self.lightning_module.trainer
        if capture_exit_event():
            chaos.request_node_exit()
            pl_trainer.should_stop = True
        elif 0 <= pl_trainer.max_steps <= chaos.step:
            pl_trainer.should_stop = True
        return out

    def teardown(self) -> None:
        super().teardown()
        if self.chaos is not None:
            self.chaos.close()


def _refuse_what_cannot_be_elastic(trainer: pl.Trainer, optimizers: list[Any]) -> None:
    """One line per option that cannot work elastically, at setup, before the join."""
    if len(optimizers) != 1:
        raise ValueError(f"configure_optimizers returned {len(optimizers)} optimizers: "
                         "ChaosStrategy replicates and averages for exactly one")
    if trainer.fit_loop.min_steps or trainer.fit_loop.min_epochs:
        raise ValueError("min_steps/min_epochs: a node that leaves must be able to stop "
                         "its fit; drop them under ChaosStrategy")
    if trainer.ckpt_path:
        raise ValueError("ckpt_path: a node resumes the cluster's state (and its own "
                         "snapshots after a power cut), not a Lightning checkpoint")
