"""Elastic Hugging Face ``Trainer``: one callback makes a ``transformers`` run train on Chaos.

    from chaos_edge.hf import ChaosCallback

    trainer = transformers.Trainer(model=model, args=args, train_dataset=train,
                                   callbacks=[ChaosCallback()])      # the one line added
    trainer.train()

Needs the ``hf`` extra (``pip install 'chaos-edge[hf]'``); start the script with
``chaosctl join -- python train.py`` on every box, one process per box (not ``torchrun``).

**How.** When training begins the callback joins the cluster with the model, the optimizer and
the LR scheduler. At the end of each backward pass that completes a step (the last
micro-batch under ``gradient_accumulation_steps``), while autograd finishes, a Chaos round
averages the gradients over the members: the agreement, the tree all-reduce and the commit
protocol, reruns after a failure included. So the ``Trainer``'s clipping (``max_grad_norm``),
its scaler and its optimizer step see the members' average, as under DDP. Without gradient
accumulation the round starts during the backward pass, each chunk sent as soon as its
gradients exist (``overlap``).

**Step boundaries.** After each optimizer step (its LR scheduler step included) the node
serves its state to joiners and writes its durable snapshot. After a ``chaosctl leave``,
Ctrl-C or SIGTERM it leaves there and ``trainer.train()`` returns. ``max_steps`` (or the steps
``num_train_epochs`` makes) counts the *cluster's* steps: every member stops at the same one.
Give each box its own data order with ``data_seed`` (the example seeds it with the node's id).

**What is replicated.** The model's parameters and buffers, the optimizer, the LR scheduler,
the fp16 scaler, and what ``state=`` registers. ``TrainerState`` (epoch, ``global_step``, the
log history) stays local.

**Refused when training begins, in one line naming the option:** more than one process
(``torchrun``, ``world_size``), DeepSpeed, FSDP, and ``resume_from_checkpoint`` (the cluster's
state is the one to resume).
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any

import torch
from accelerate.state import GradientState
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from chaos_edge.trainer import Trainer, capture_exit_event
from chaos_edge.trainer.stepper import refuse_step_arguments

__all__ = ["ChaosCallback"]


class ChaosCallback(TrainerCallback):
    """Averages each step's gradients over the cluster and makes membership change only
    between steps (module docstring).

    Args:
        state: More of the run's state to replicate (counters, an EMA model...), as the
            :class:`~chaos_edge.Trainer` takes it; the LR scheduler and scaler are in already.
        overlap: Start each round during the backward pass (default: when there is no
            gradient accumulation, which it cannot serve). The result is the same bit for bit.
        trainer: Any other :class:`~chaos_edge.Trainer` argument (``samples_per_step``,
            ``timeout``, ...) but those of the optimizer step, which stays the ``Trainer``'s.

    Attributes:
        chaos: The :class:`~chaos_edge.Trainer` once training began (``step``, ``node_id``,
            ``state_digest()``...).
    """

    def __init__(self, *, state: Mapping[str, Any] | None = None, overlap: bool | None = None,
                 **trainer: Any) -> None:
        refuse_step_arguments(trainer, "the Hugging Face Trainer clips, scales and steps the "
                              "optimizer; use its TrainingArguments (max_grad_norm, fp16)")
        self._extra = dict(state or {})
        self._overlap = overlap
        self._kwargs = trainer
        self.chaos: Trainer | None = None
        self._sync = GradientState()  # accelerate's: is this micro-batch the step's last?
        self._queued = False

    def on_train_begin(self, args: TrainingArguments, state: TrainerState,
                       control: TrainerControl, model: torch.nn.Module | None = None,
                       optimizer: Any = None, lr_scheduler: Any = None,
                       **kwargs: Any) -> None:
        if self.chaos is not None:
            raise ValueError("ChaosCallback: train() ran twice; use one callback per run")
        _refuse_what_cannot_be_elastic(args, state)
        assert model is not None and optimizer is not None
        # accelerate wraps both; Chaos replicates what they wrap.
        opt = getattr(optimizer, "optimizer", optimizer)
        objects: dict[str, Any] = {}
        if lr_scheduler is not None:
            objects["lr_scheduler"] = getattr(lr_scheduler, "scheduler", lr_scheduler)
        scaler = getattr(optimizer, "scaler", None)
        if scaler is not None:
            objects["grad_scaler"] = scaler
        objects.update(self._extra)
        overlap = (args.gradient_accumulation_steps == 1 if self._overlap is None
                   else self._overlap)
        if overlap and args.gradient_accumulation_steps != 1:
            raise ValueError("gradient_accumulation_steps: overlap=True sends each gradient "
                             "as backward makes it; accumulate with overlap=False")
        self.chaos = self._join(model, opt, objects, overlap)
        for p in model.parameters():
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(self._grad_done)

    def _join(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
              objects: dict[str, Any], overlap: bool) -> Trainer:
        chaos = Trainer(model, optimizer, state=objects, step_optimizer=False, overlap=overlap,
                        **self._kwargs)
        atexit.register(chaos.close)
        return chaos

    def _grad_done(self, _param: torch.Tensor) -> None:
        """(autograd) A gradient is in: on the step's last micro-batch, average once the
        whole backward pass is done (autograd runs the queued callback then)."""
        if self._queued or not self._sync.sync_gradients:
            return
        self._queued = True
        torch.autograd.Variable._execution_engine.queue_callback(self._average)

    def _average(self) -> None:
        self._queued = False
        assert self.chaos is not None
        self.chaos.update()  # .grad now holds the members' average

    def on_step_end(self, args: TrainingArguments, state: TrainerState,
                    control: TrainerControl, **kwargs: Any) -> None:
        """The step boundary: the optimizer and LR scheduler have stepped."""
        chaos = self.chaos
        if chaos is None:
            return
        chaos.check_state_replication()
        if capture_exit_event():
            chaos.request_node_exit()
            control.should_training_stop = True
        elif 0 < state.max_steps <= chaos.step:
            control.should_training_stop = True

    def on_train_end(self, args: TrainingArguments, state: TrainerState,
                     control: TrainerControl, **kwargs: Any) -> None:
        if self.chaos is not None:
            self.chaos.close()


def _refuse_what_cannot_be_elastic(args: TrainingArguments, state: TrainerState) -> None:
    """One line per option that cannot work elastically, before the join."""
    if args.world_size > 1:
        raise ValueError(f"world_size={args.world_size}: run one process per box under "
                         "`chaosctl join`, not torchrun; Chaos forms the group itself")
    if getattr(args, "deepspeed", None):
        raise ValueError("deepspeed: Chaos replicates the whole state on every member; "
                         "it cannot shard it")
    if getattr(args, "fsdp", None):
        raise ValueError("fsdp: Chaos replicates the whole state on every member; "
                         "it cannot shard it")
    if state.global_step:
        raise ValueError("resume_from_checkpoint: a node resumes the cluster's state (and "
                         "its own snapshots after a power cut), not a Trainer checkpoint")
