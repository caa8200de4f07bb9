"""Train a small CNN on scikit-learn's bundled 8x8 digits across a Chaos cluster (offline data).

What a real training script needs when boxes come and go, on the public API only:

- BatchNorm (its running statistics are averaged over the members every step) and Dropout;
- AdamW, and a one-cycle LR schedule registered in ``state=``: a joiner gets the cluster's
  schedule, not a fresh one;
- ``clip_grad_norm=``: the *averaged* gradient is clipped, on every member alike;
- a ``GradScaler`` where it applies (``--amp fp16``; bf16 needs none);
- consistent mode (``global_batch=``): the global batch stays the same whoever joins or
  leaves, and ``trainer.shard`` says which positions of it are this member's. The sample
  position lives in ``trainer.state``, so after a resize every member reshards the same data
  order from the same place.

    chaosctl join -- python -m chaos_edge.examples.cnn --epochs 20 --global-batch 128

Needs scikit-learn (the ``examples`` extra).
"""

from __future__ import annotations

import argparse
import functools
import logging
import math
import os
import sys
from typing import NamedTuple

import numpy as np
import torch
from torch import nn

from chaos_edge import ChaosError, Trainer, capture_exit_event
from chaos_edge.examples.digits import arrays

VAL_FRACTION = 0.2


class Data(NamedTuple):
    """The digits as (N, 1, 8, 8) images scaled to [-1, 1], split once and for all."""

    x_train: torch.Tensor
    y_train: torch.Tensor
    x_val: torch.Tensor
    y_val: torch.Tensor


def split(x: np.ndarray, y: np.ndarray) -> Data:
    """A fixed 80/20 train/validation split (the same on every box)."""
    perm = np.random.default_rng(0).permutation(len(y))
    n_val = int(len(y) * VAL_FRACTION)
    xs = torch.tensor(x / 8.0 - 1.0, dtype=torch.float32).reshape(-1, 1, 8, 8)
    ys = torch.tensor(y, dtype=torch.long)
    val, train = torch.as_tensor(perm[:n_val]), torch.as_tensor(perm[n_val:])
    return Data(xs[train], ys[train], xs[val], ys[val])


class DigitsCNN(nn.Module):
    """conv-BN-ReLU, conv-BN-ReLU, max-pool, dropout, linear-ReLU, dropout, linear."""

    def __init__(self, width: int = 16, hidden: int = 64, dropout: float = 0.2) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, 2 * width, 3, padding=1), nn.BatchNorm2d(2 * width), nn.ReLU(),
            nn.MaxPool2d(2), nn.Dropout(dropout))
        self.head = nn.Sequential(nn.Flatten(), nn.Linear(2 * width * 16, hidden), nn.ReLU(),
                                  nn.Dropout(dropout), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


@functools.lru_cache(maxsize=4)
def _perm(seed: int, n: int, sweep: int) -> np.ndarray:
    return np.random.default_rng([seed, sweep]).permutation(n)


def order(seed: int, n: int, first: int, count: int) -> np.ndarray:
    """Dataset indices of global sample positions ``first .. first + count``: sweep ``e`` over
    the ``n`` samples is a permutation seeded by ``(seed, e)``. Every member computes the same
    order, so a shard is just a slice of it, however the cluster is split."""
    pos = np.arange(first, first + count)
    out = np.empty(count, dtype=np.int64)
    for sweep in np.unique(pos // n):
        sel = pos // n == sweep
        out[sel] = _perm(seed, n, int(sweep))[pos[sel] % n]
    return out


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x), y)


@torch.no_grad()
def evaluate(model: nn.Module, data: Data) -> tuple[float, float]:
    """(validation loss, accuracy), with BatchNorm's running statistics and no dropout."""
    model.eval()
    try:
        logits = model(data.x_val)
        loss = nn.functional.cross_entropy(logits, data.y_val).item()
        return loss, (logits.argmax(1) == data.y_val).float().mean().item()
    finally:
        model.train()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos_edge.examples.cnn",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--global-batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.01, help="peak of the one-cycle schedule")
    ap.add_argument("--amp", choices=("off", "bf16", "fp16"), default="off",
                    help="CPU autocast; fp16 scales the loss with a GradScaler")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper())
    torch.set_num_threads(1)  # one box, one core: several workers share a small machine
    try:
        data = split(*arrays())
    except ImportError:
        print("cnn: needs scikit-learn: pip install 'chaos-edge[examples]'", file=sys.stderr)
        return 2
    torch.manual_seed(args.seed)  # every node builds the same model; the cluster's wins anyway
    model = DigitsCNN()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=1e-4)
    n = len(data.y_train)
    steps = math.ceil(args.epochs * n / args.global_batch)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=args.lr, total_steps=steps)
    scaler = torch.amp.GradScaler("cpu") if args.amp == "fp16" else None
    dtype = torch.float16 if args.amp == "fp16" else torch.bfloat16
    try:
        trainer = Trainer(model, opt, state={"sched": sched, "counters": {"pos": 0}},
                          scaler=scaler, clip_grad_norm=1.0, global_batch=args.global_batch)
    except ChaosError as exc:  # chaosd unreachable, the join failed, or another model
        print(f"cnn: {exc}", file=sys.stderr)
        return 1
    print(f"{trainer.node_id}: joined at step {trainer.step}", flush=True)
    while trainer.state["counters"]["pos"] < args.epochs * n:
        sh = trainer.shard  # this member's positions of this step's global batch
        pos = trainer.state["counters"]["pos"]
        if sh.size:  # a member may get no share of a step: then it adds no gradient
            idx = torch.as_tensor(order(args.seed, n, pos + sh.start, sh.size))
            with torch.autocast("cpu", dtype=dtype, enabled=args.amp != "off"):
                loss = loss_of(model, data.x_train[idx], data.y_train[idx])
            (scaler.scale(loss) if scaler is not None else loss).backward()
        trainer.update()  # all-reduce, unscale, clip, step: never opt.step() here
        if sched.last_epoch + 1 < steps:  # OneCycleLR refuses a step past its end
            sched.step()
        trainer.state["counters"]["pos"] = pos + sh.global_batch
        trainer.check_state_replication()
        if (pos + sh.global_batch) // n > pos // n:  # an epoch ended
            val_loss, acc = evaluate(model, data)
            print(f"epoch {(pos + sh.global_batch) // n} step {trainer.step} members "
                  f"{len(sh.members)} val_loss {val_loss:.4f} acc {acc:.3f}", flush=True)
        if capture_exit_event():
            trainer.request_node_exit()
            print(f"{trainer.node_id}: left at step {trainer.step}", flush=True)
            return 0
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
