"""The training worker of ``chaosctl bench convergence`` (``python -m
chaos_bench.convergence.worker``).

It trains one of the shipped examples' models (:mod:`chaos_edge.examples.cnn`,
:mod:`chaos_edge.examples.chartf`: one definition of the models, the data and its order) with
AdamW, a OneCycleLR stepped every step and registered in ``state=``, ``clip_grad_norm=1.0``
and, with ``--global-batch``, consistent mode. The sample position, and the run's two
phases, live in ``trainer.state["counters"]``, so a joiner continues exactly where the
cluster is.

*Formation.* Until ``--start-nodes`` members train together, the cluster runs formation
steps: no data, a zero gradient and a learning rate of 0, which leave the model as it was
(AdamW's moments stay 0; its step count is reset when training starts). So every run, static
or not, trains its first sample with all its starting nodes, from the same initial state.

*The gate.* At the first step boundary at or past epoch ``--gate-epoch`` every member writes
a ``gate`` record and waits for the file ``--gate``: the driver makes its change there (a join
or a leave, which a leaver obeys at once) before it releases the cluster, so that the change
lands a few steps after the same point in every run.

Records, one JSON line each, in ``--out``: ``start``, ``step`` (``phase`` "form" or "train",
``loss`` and ``size`` of this member's part, ``members``, ``global_batch``, ``pos`` after the
step, ``lr`` of the step, ``digest`` of the whole state), ``eval`` (written by the lowest
member id at every epoch boundary: ``val_loss``, ``val_acc``), ``gate``, ``leave`` (about to
leave) and ``exit`` (the last step it took part in, its drain included), ``done``.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from chaos_edge import Trainer, capture_exit_event
from chaos_edge.examples import chartf, cnn

HOLD_POLL_S = 0.01
FORM_SLEEP_S = 0.05  # formation steps do no work: leave the CPU to the workers starting up


class Task:
    """One model with its data: how to build it, batch it and evaluate it."""

    def __init__(self, model: str, tiny: bool, data: str, seed: int) -> None:
        self.loss: Callable[[nn.Module, torch.Tensor, torch.Tensor], torch.Tensor]
        self.evaluate: Callable[[nn.Module], tuple[float, float]]
        if model == "cnn":
            path = Path(data) if data else None
            if path is not None and path.exists():
                with np.load(path) as z:  # the driver loaded scikit-learn once for all
                    x, y = z["x"], z["y"]
            else:
                x, y = cnn.arrays()
            d = cnn.split(x, y)
            self.n = len(d.y_train)
            self.model: nn.Module = cnn.DigitsCNN(*((4, 16) if tiny else (16, 64)))
            self.lr, self.loss = 0.01, cnn.loss_of
            self.evaluate = lambda m: cnn.evaluate(m, d)
            self._get = lambda idx: (d.x_train[idx], d.y_train[idx])
        else:
            t = chartf.load(*((8_000, 16) if tiny else (48_000, 32)))
            self.n = t.n_train
            dims = {"d_model": 16, "layers": 1} if tiny else {"d_model": 64, "layers": 2}
            self.model = chartf.CharTransformer(len(t.vocab), t.context, **dims)
            self.lr, self.loss = 3e-3, chartf.loss_of
            self.evaluate = lambda m: chartf.evaluate(m, t)
            self._get = lambda idx: chartf.batch(t, idx)
        self.seed = seed

    def batch(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The samples at global positions ``first .. first + count``."""
        return self._get(torch.as_tensor(cnn.order(self.seed, self.n, first, count)))


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Chaos convergence bench worker.")
    ap.add_argument("--model", choices=("cnn", "chartf"), required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--epochs", type=int, required=True)
    ap.add_argument("--epoch-samples", type=int, required=True)
    ap.add_argument("--batch", type=int, default=32, help="local batch without --global-batch")
    ap.add_argument("--global-batch", type=int, default=0, help="consistent mode when > 0")
    ap.add_argument("--start-nodes", type=int, default=1)
    ap.add_argument("--gate-epoch", type=int, default=-1)
    ap.add_argument("--gate", default="")
    ap.add_argument("--data", default="", help="digits as .npz (x, y), if the driver made it")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--tiny", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train until the sample budget is spent (or a leave); returns the exit status."""
    args = parse(argv)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper(),
                        format="%(asctime)s %(name)s %(message)s")
    torch.set_num_threads(1)  # several workers share the box's cores
    torch.manual_seed(args.seed)  # every node, and every run, builds the same model
    task = Task(args.model, args.tiny, args.data, args.seed)
    model = task.model
    opt = torch.optim.AdamW(model.parameters(), lr=task.lr, weight_decay=1e-4)
    budget = args.epochs * args.epoch_samples
    first_gb = args.global_batch or args.batch * args.start_nodes
    steps = math.ceil(budget / first_gb)  # the schedule's length as the run starts
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=task.lr, total_steps=steps)
    trainer = Trainer(model, opt, state={"sched": sched, "counters": {
        "pos": 0, "started": False, "gate": args.gate_epoch < 0}}, clip_grad_norm=1.0,
        global_batch=args.global_batch or None, samples_per_step=args.batch, timeout=60.0)
    with open(args.out, "a") as out:
        def write(kind: str, **row: Any) -> None:
            out.write(json.dumps({"kind": kind, "node": trainer.node_id,
                                  "t": round(time.time(), 3), **row}) + "\n")
            out.flush()

        c = trainer.state["counters"]
        write("start", step=trainer.step, pid=os.getpid(), pos=c["pos"], started=c["started"])
        while True:
            c = trainer.state["counters"]  # a join replaces it with the cluster's
            if c["started"] and c["pos"] >= budget:
                break
            sh = trainer.shard
            if not c["started"]:
                form_step(trainer, opt, sched, task, sh, args, write)
            elif not c["gate"] and c["pos"] >= args.gate_epoch * args.epoch_samples:
                hold(trainer, Path(args.gate), write)
            else:
                train_step(trainer, opt, sched, task, sh, args, steps, write)
            if capture_exit_event():
                write("leave", step=trainer.step)
                trainer.request_node_exit()
                write("exit", step=trainer.step)
                return 0
        write("done", step=trainer.step)
    trainer.close()
    return 0


def form_step(trainer: Trainer, opt: torch.optim.Optimizer, sched: Any, task: Task, sh: Any,
              args: argparse.Namespace, write: Callable[..., None]) -> None:
    """A round with no data and a learning rate of 0, while the starting nodes join.

    The LR comes back from the schedule, which is replicated (a snapshot taken inside
    ``update()`` carries the 0). Training starts after the first round that ran with all the
    starting nodes under the policy the shard was read from: when the policy version did not
    change in the round, every member's shard was cut from the round's own policy, so they
    all see the same members and decide alike (a shard read before a new policy arrived
    would have made one member start and another not)."""
    before = trainer.policy_version
    for g in opt.param_groups:
        g["lr"] = 0.0
    try:
        trainer.update()
    finally:
        for g, lr in zip(opt.param_groups, sched.get_last_lr(), strict=True):
            g["lr"] = lr
    if trainer.policy_version == before and len(sh.members) >= args.start_nodes:
        # AdamW starts afresh (formation only counted steps: its moments are zero).
        for st in opt.state.values():
            for v in st.values():
                if isinstance(v, torch.Tensor):
                    v.zero_()
        trainer.state["counters"]["started"] = True
    trainer.check_state_replication()
    write("step", phase="form", step=trainer.step, members=list(sh.members), size=sh.size,
          global_batch=sh.global_batch, loss=None, pos=0, lr=0.0,
          digest=trainer.state_digest(), policy_version=trainer.policy_version)
    if trainer.state["counters"]["started"]:
        evaluate(trainer, task, 0, args.epoch_samples, sh.members, write)
    else:
        time.sleep(FORM_SLEEP_S)


def hold(trainer: Trainer, gate: Path, write: Callable[..., None]) -> None:
    """Wait at the gate until the driver has made its change and releases it. A node asked
    to leave goes at once, from the gate (its last rounds wait for the release)."""
    write("gate", step=trainer.step, pos=trainer.state["counters"]["pos"])
    while not gate.exists() and not capture_exit_event():
        trainer.check_state_replication()  # serve a joiner, see a leave
        time.sleep(HOLD_POLL_S)
    trainer.state["counters"]["gate"] = True  # every member at this same step


def train_step(trainer: Trainer, opt: torch.optim.Optimizer, sched: Any, task: Task,
               sh: Any, args: argparse.Namespace, steps: int,
               write: Callable[..., None]) -> None:
    """One step on this member's positions of the step's global batch."""
    pos = trainer.state["counters"]["pos"]
    lr = opt.param_groups[0]["lr"]
    loss = None
    if sh.size:
        x, y = task.batch(pos + sh.start, sh.size)
        torch.manual_seed(args.seed * 1_000_003 + pos + sh.start)  # dropout, per position
        value = task.loss(task.model, x, y)
        value.backward()
        loss = float(value.detach())
    trainer.update()
    if sched.last_epoch + 1 < steps:  # a grown global batch ends early, a shrunk one late
        sched.step()
    after = pos + sh.global_batch
    trainer.state["counters"]["pos"] = after
    trainer.check_state_replication()
    write("step", phase="train", step=trainer.step, members=list(sh.members), size=sh.size,
          global_batch=sh.global_batch, loss=loss, pos=after, lr=lr,
          digest=trainer.state_digest(), policy_version=trainer.policy_version)
    if after // args.epoch_samples > pos // args.epoch_samples:
        evaluate(trainer, task, after, args.epoch_samples, sh.members, write)


def evaluate(trainer: Trainer, task: Task, pos: int, epoch_samples: int,
             members: Any, write: Callable[..., None]) -> None:
    """Validation loss and accuracy at an epoch boundary, by the lowest member id only."""
    if trainer.node_id != min(members):
        return
    val_loss, val_acc = task.evaluate(task.model)
    write("eval", step=trainer.step, pos=pos, epoch=pos / epoch_samples,
          val_loss=val_loss, val_acc=val_acc)


if __name__ == "__main__":
    sys.exit(main())
