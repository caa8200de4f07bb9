"""A training worker as a PyTorch user writes it, on the whole Trainer API of issue 9.

A small CNN with BatchNorm2d, BatchNorm1d and Dropout learns scikit-learn's digits with
AdamW (two parameter groups), a OneCycleLR stepped after every ``update()`` and registered in
``state=``, a JSON counter in ``state=`` (the sample position), ``clip_grad_norm=1.0`` and a
``GradScaler("cpu")`` passed as ``scaler=``, under CPU autocast in bfloat16 where it works.
Each step's samples come from ``trainer.shard`` (consistent mode: ``--global-batch``).

Per committed step it appends one JSON line to ``--out`` with a digest of each part of the
state, so that a failing test says *which* part differs: ``params``, ``buffers``, ``optim``,
``sched``, ``scaler``, the ``lr`` of each group, the counter ``pos``, the Trainer's own
``digest``; plus ``step``, ``loss``, ``members``, ``shard``, ``policy_version`` and ``pid``.
A ``ChaosError`` (a refused join, say) is printed as one line on stderr, appended to
``--out`` + ``.errors`` as JSON, and the worker exits 1.

``--corrupt-at STEP`` adds 1e-3 to one parameter right after that step's ``update()``, once
per ``--out`` (a marker file keeps a restarted worker from doing it again): silent corruption
for the divergence guard to find. ``--corrupt-after N`` does it N steps after this worker's
first committed step instead (a test cannot know at which step a joiner starts). The record of
that step says ``"corrupted": true``.
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import json
import logging
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from chaos_edge import ChaosError, Trainer, capture_exit_event

MAX_LR = 0.02
CORRUPT_BY = 1e-3


class Net(nn.Module):
    """Conv -> BatchNorm2d -> pool -> Linear -> BatchNorm1d -> Dropout -> Linear (8x8 digits)."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(1, width, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(width)
        self.fc1 = nn.Linear(width * 16, 32)
        self.bn1 = nn.BatchNorm1d(32)
        self.drop = nn.Dropout(0.2)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = nn.functional.max_pool2d(torch.relu(self.bn2(self.conv(x))), 2)
        x = self.drop(torch.relu(self.bn1(self.fc1(x.flatten(1)))))
        return self.fc2(x)


def build(width: int, sched: str, steps: int
          ) -> tuple[Net, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler]:
    """The model, AdamW with decay on weights only, and the LR schedule (the test's reference
    for the lr at each step builds the same)."""
    torch.manual_seed(0)  # every node builds the same model; the cluster's state wins anyway
    model = Net(width)
    decay = [p for n, p in model.named_parameters() if n.endswith("weight") and p.dim() > 1]
    rest = [p for n, p in model.named_parameters() if not (n.endswith("weight") and p.dim() > 1)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": rest, "weight_decay": 0.0}], lr=MAX_LR)
    if sched == "onecycle":
        # One more than the steps: OneCycleLR raises when stepped past its total.
        s: torch.optim.lr_scheduler.LRScheduler = torch.optim.lr_scheduler.OneCycleLR(
            opt, max_lr=MAX_LR, total_steps=steps + 1)
    else:
        s = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=steps + 1)
    return model, opt, s


def _feed(h: Any, obj: Any) -> None:
    """Hash ``obj`` canonically: tensors by dtype, shape and bytes; dicts in key order."""
    if isinstance(obj, torch.Tensor):
        t = obj.detach().cpu().contiguous().reshape(-1)
        h.update(f"T{t.dtype}{tuple(obj.shape)}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes())
    elif isinstance(obj, dict):
        h.update(b"{")
        for key in sorted(obj, key=repr):
            h.update(repr(key).encode())
            _feed(h, obj[key])
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for item in obj:
            _feed(h, item)
        h.update(b"]")
    else:  # numbers, strings, None: repr is exact (floats round-trip)
        h.update(f"{type(obj).__name__}:{obj!r}".encode())


def digest(obj: Any) -> str:
    """A short SHA-256 of ``obj`` (enough to tell states apart in a test)."""
    h = hashlib.sha256()
    _feed(h, obj)
    return h.hexdigest()[:16]


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as (N, 1, 8, 8) features in [0, 1] and labels."""
    from chaos_edge.examples.digits import load

    x, y = load()
    return x.reshape(-1, 1, 8, 8), y


def autocast_works(model: nn.Module) -> bool:
    """Whether CPU autocast in bfloat16 runs this model's ops (else plain fp32)."""
    try:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
            model.eval()
            model(torch.zeros(2, 1, 8, 8))
        return True
    except RuntimeError:
        return False
    finally:
        model.train()


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Chaos whole-state test worker.")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--sleep-per-sample", type=float, default=0.0,
                    help="extra compute seconds per sample of the shard (a slow box)")
    ap.add_argument("--digest-every", type=int, default=100)
    ap.add_argument("--corrupt-at", type=int, default=-1)
    ap.add_argument("--corrupt-after", type=int, default=-1)
    ap.add_argument("--leave-at", type=int, default=-1)
    ap.add_argument("--width", type=int, default=8, help="conv channels (the model's shape)")
    ap.add_argument("--sched", choices=("onecycle", "cosine"), default="onecycle")
    ap.add_argument("--global-batch", type=int, default=48)
    ap.add_argument("--fp32", action="store_true", help="no autocast")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    """Train until ``--steps`` (or a leave); returns the exit status."""
    args = parse(argv)
    torch.set_num_threads(1)  # a few workers share a small box: no oversubscribed cores
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand
    level = os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    try:
        return train(args)
    except ChaosError as exc:
        line = f"{type(exc).__name__}: {exc}"
        print(line, file=sys.stderr, flush=True)
        with open(args.out + ".errors", "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "error": type(exc).__name__,
                                "message": str(exc)}) + "\n")
        return 1


def train(args: argparse.Namespace) -> int:
    x_all, y_all = load_digits()
    n = len(y_all)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))  # the same everywhere
    model, opt, sched = build(args.width, args.sched, args.steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10, growth_interval=25)
    amp = not args.fp32 and autocast_works(model)
    trainer = Trainer(model, opt, state={"sched": sched, "counters": {"pos": 0}}, scaler=scaler,
                      clip_grad_norm=1.0, digest_every=args.digest_every,
                      global_batch=args.global_batch, timeout=60.0)
    print(f"{trainer.node_id}: autocast {'bf16' if amp else 'off'}, starting at step "
          f"{trainer.step}", flush=True)
    marker = Path(args.out + ".corrupted")
    first = -1  # this worker's first committed step
    with open(args.out, "a") as out:
        while trainer.step < args.steps:
            sh = trainer.shard
            pos = trainer.state["counters"]["pos"]
            idx = perm[(pos + sh.start + torch.arange(sh.size)) % n]
            if len(idx) == 1:
                idx = idx.repeat(2)  # BatchNorm1d cannot train on one sample
            loss = torch.zeros(())
            if len(idx):  # a member with no share this step contributes no gradient
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                    loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx])
                scaler.scale(loss).backward()
            trainer.update()
            first = trainer.step if first < 0 else first
            corrupt = not marker.exists() and (
                trainer.step == args.corrupt_at
                or (args.corrupt_after >= 0 and trainer.step == first + args.corrupt_after))
            if corrupt:
                part = marker.with_name(marker.name + ".part")  # whole, for a test reading it
                part.write_text(str(os.getpid()))
                os.replace(part, marker)
                with torch.no_grad():
                    model.fc1.weight.view(-1)[0] += CORRUPT_BY
            sched.step()
            trainer.state["counters"]["pos"] += sh.global_batch
            trainer.check_state_replication()
            row = record(trainer, model, opt, sched, scaler, sh, loss)
            out.write(json.dumps({**row, "corrupted": corrupt}) + "\n")
            out.flush()
            if args.sleep or args.sleep_per_sample:
                time.sleep(args.sleep + args.sleep_per_sample * sh.size)
            if capture_exit_event() or trainer.step == args.leave_at:
                trainer.request_node_exit()
                return 0
    trainer.close()
    return 0


def record(trainer: Any, model: nn.Module, opt: torch.optim.Optimizer, sched: Any,
           scaler: torch.amp.GradScaler, sh: Any, loss: torch.Tensor) -> dict[str, Any]:
    """One step's line: a digest per part of the state, and what the step was."""
    return {
        "step": trainer.step, "pid": os.getpid(), "loss": float(loss.detach()),
        "members": list(sh.members),
        "shard": {"index": sh.index, "start": sh.start, "size": sh.size,
                  "global_batch": sh.global_batch, "step": sh.step},
        "policy_version": trainer.policy_version,
        "params": digest(dict(model.named_parameters())),
        "buffers": digest(dict(model.named_buffers())),
        "optim": digest(opt.state_dict()),
        "sched": digest(sched.state_dict()),
        "scaler": digest(scaler.state_dict()),
        "lr": [g["lr"] for g in opt.param_groups],
        "pos": trainer.state["counters"]["pos"],
        "digest": trainer.state_digest(),
    }


if __name__ == "__main__":
    sys.exit(main())
