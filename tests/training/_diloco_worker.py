"""A training worker for the diloco tests: the script is the same as in every-step mode.

The CNN with BatchNorm and Dropout of ``_full_worker.py`` on scikit-learn's digits, AdamW,
a OneCycleLR and a JSON counter registered in ``state=``, ``clip_grad_norm=1.0``; plain mode
(``--batch`` samples per member and step). The cluster's ``[training] sync = "diloco"`` makes
the Trainer step locally and sync every ``inner_steps`` (``"streaming"``: one fragment every
``inner_steps / fragments``).

One JSON line per ``update()``: ``step``, ``pid``, ``loss``, ``members``; after an outer round
also ``outer``: a digest of the synced parameters, the outer momentum, the buffers, the
scheduler, the lr, the counter, the Trainer's state digest and the outer ``count``.

``--check-overlap``: every all-reduce that runs off the training thread (a streaming round in
flight, ``[training] overlap``) first waits until the ``update()`` that started it has
returned, and writes ``<out>.overlap-violations`` if it waited 30 s (that ``update()`` waited
for the round instead); the rows count such rounds in ``in_flight``.

``--rounds``: in the row of each ``update()`` that committed a round (of whatever mode is
in force: a sync-mode switch moves them; with overlap, the one it landed in), also ``round``:
the data plane's round number, the mode, its anchor step and the Trainer's state digest.

``--die-in-outer``: once the file ``<out>.arm`` exists, the worker SIGKILLs itself in the
middle of its next outer round (from the all-reduce's fault hook, at its first send), once per
``--out`` (a marker file keeps the restarted worker alive).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repo, for tests.training

from chaos_edge import ChaosError, Trainer, capture_exit_event
from tests.training._full_worker import build, digest, load_digits


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Chaos diloco test worker.")
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sleep", type=float, default=0.02)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--digest-every", type=int, default=8)
    ap.add_argument("--die-in-outer", action="store_true")
    ap.add_argument("--check-overlap", action="store_true")
    ap.add_argument("--rounds", action="store_true")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    torch.set_num_threads(1)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper(),
                        format="%(asctime)s %(name)s %(message)s")
    try:
        return train(args)
    except ChaosError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
        with open(args.out + ".errors", "a") as f:
            f.write(json.dumps({"pid": os.getpid(), "error": type(exc).__name__,
                                "message": str(exc)}) + "\n")
        return 1


def arm_kill(trainer: Trainer, marker: Path) -> None:
    """SIGKILL this process at the all-reduce's next send: mid outer round."""

    def hook(event: str, index: int) -> None:
        # The round's step (trainer.step already counts a streaming round in flight).
        # Whole or not at all: the test reads it the moment it exists (once, empty).
        part = marker.with_name(marker.name + ".part")
        part.write_text(f"{os.getpid()} {event} step {trainer._replica.step + 1}")
        os.replace(part, marker)
        os.kill(os.getpid(), signal.SIGKILL)

    trainer.reducer.fault_hook = hook


class Updates:
    """How many update() calls began and how many returned."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.begun = self.done = 0

    def begin(self) -> None:
        with self.cond:
            self.begun += 1

    def end(self) -> None:
        with self.cond:
            self.done += 1
            self.cond.notify_all()


def watch_overlap(trainer: Trainer, out: str, updates: Updates) -> list[int]:
    """Make a round in flight wait for the update() that started it to return (see
    ``--check-overlap``); returns the count of such rounds."""
    count = [0]
    allreduce = trainer.reducer.allreduce

    def wrapped(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            count[0] += 1
            with updates.cond:
                mine = updates.begun  # the update() that started this round
                if not updates.cond.wait_for(lambda: updates.done >= mine, 30):
                    with open(out + ".overlap-violations", "a") as f:
                        f.write(f"step {trainer._replica.step + 1}: update() waited for "
                                f"its round\n")
        return allreduce(*args, **kwargs)

    trainer.reducer.allreduce = wrapped  # type: ignore[method-assign]
    return count


def train(args: argparse.Namespace) -> int:
    x_all, y_all = load_digits()
    n = len(y_all)
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    model, opt, sched = build(8, "onecycle", args.steps)
    trainer = Trainer(model, opt, state={"sched": sched, "counters": {"pos": 0}},
                      clip_grad_norm=1.0, digest_every=args.digest_every,
                      samples_per_step=args.batch, timeout=60.0)
    arm, marker = Path(args.out + ".arm"), Path(args.out + ".killed")
    updates = Updates()
    in_flight = watch_overlap(trainer, args.out, updates) if args.check_overlap else [0]
    last_round = -1
    with open(args.out, "a") as out:
        while trainer.step < args.steps:
            sh = trainer.shard
            pos = trainer.state["counters"]["pos"]
            # Each member its own samples; the counter moves by a constant, so every member
            # agrees on it at every step (members agree on no membership between outer steps).
            idx = perm[(pos * 3 + sh.index * args.batch + torch.arange(args.batch)) % n]
            loss = nn.functional.cross_entropy(model(x_all[idx]), y_all[idx])
            loss.backward()
            rhythm = trainer._replica.rhythm  # where the rounds of the mode in force fall
            if args.die_in_outer and arm.exists() and not marker.exists() and (
                    trainer._outer is not None and rhythm.ends_round(trainer.step + 1)):
                arm_kill(trainer, marker)
            updates.begin()
            trainer.update()
            updates.end()
            sched.step()
            trainer.state["counters"]["pos"] += args.batch
            trainer.check_state_replication()
            row: dict[str, Any] = {"step": trainer.step, "pid": os.getpid(),
                                   "in_flight": in_flight[0],
                                   "loss": float(loss.detach()), "members": list(sh.members)}
            o = trainer._outer
            # After each outer round: in streaming mode with overlap, once it has landed (in
            # the next update()), so that no reading of the state lands it early.
            rhythm = trainer._replica.rhythm
            if o is not None and rhythm.ends_round(trainer.step - int(rhythm.mode.overlap)):
                row["outer"] = {
                    "synced": digest(o.synced), "params": digest(dict(model.named_parameters())),
                    "momentum": digest(o.momentum), "count": o.count,
                    "buffers": digest(dict(model.named_buffers())),
                    "sched": digest(sched.state_dict()), "lr": [g["lr"] for g in opt.param_groups],
                    "pos": trainer.state["counters"]["pos"], "digest": trainer.state_digest(),
                }
            n_round = trainer._replica.round_step()  # committed rounds, numbered on
            if args.rounds and n_round != last_round:
                last_round = n_round
                row["round"] = {"n": n_round, "mode": rhythm.mode.mode,
                                "H": rhythm.mode.inner_steps, "anchor": rhythm.anchor_step,
                                "digest": trainer.state_digest()}
            out.write(json.dumps(row) + "\n")
            out.flush()
            time.sleep(args.sleep)
            if capture_exit_event():
                trainer.request_node_exit()
                return 0
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
