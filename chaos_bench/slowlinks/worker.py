"""The training worker of ``chaosctl bench slowlinks``: one script for every sync mode.

``--task`` (:mod:`.task`: the splits, the model, the batch orders of ``--seed``) is learned
with Adam: an MLP on scikit-learn's digits, or the character transformer on Python's help
texts; the cluster's ``[training] sync`` and ``wire`` decide whether ``update()``
all-reduces every step or runs DiLoCo, and in which format. The script does not know which.
``--chunk`` is the all-reduce's pipeline chunk (0: the Trainer's default, one chunk for a
vector this small).

The run is the same task in every mode: until the global step ``START`` (read from
``<dir>/start`` once the bench has seen every node join) the worker trains on no samples
(``update(samples=0)``: the parameters do not move), so the nodes that joined first do not
train alone, and at ``START`` it clears Adam's state (warm-up rounds stepped it on zeros);
from ``START`` to ``START + --steps`` every member takes ``--batch`` samples of its own per
step. The worker of ``--eval-node`` evaluates the model on the validation and test splits
every ``--eval-every`` steps and at the end (every step in every-step mode; in DiLoCo modes
every H steps, on the synced parameters, the model every member shares: in streaming mode a
member's own parameters are never all synced at once). Each worker writes
``<dir>/<node>.json`` at the end: its evaluations with the wall time since ``START``
(evaluation time excluded) and the bytes its data links sent, read from ``/proc/net/dev`` of
its namespace (every interface but ``lo`` and the testbed's ``mgmt``), and ``rounds``: the
largest and the median bytes and seconds of one ``update()`` that ran a round (the peak a
link must carry at once, and the longest stall).
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from chaos_bench.workers import tx_bytes

WARMUP_SLEEP_S = 0.05  # between no-sample steps: the bench needs time to name START
SKIP_DEVICES = ("lo", "mgmt")


def data_tx_bytes() -> int:
    """Bytes sent by this namespace's data links."""
    return tx_bytes(SKIP_DEVICES)


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Chaos slow-links bench worker.")
    ap.add_argument("--dir", required=True, help="the run's shared directory")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--eval-every", type=int, default=10)
    ap.add_argument("--eval-node", default="n1")
    ap.add_argument("--seed", type=int, default=0, help="initial weights and batch orders")
    ap.add_argument("--chunk", type=int, default=0, help="all-reduce chunk bytes (0: default)")
    ap.add_argument("--task", default="digits", choices=("digits", "chartf"))
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    from chaos_bench.slowlinks.task import batch_generator, load
    from chaos_edge import ChaosError, Trainer

    torch.set_num_threads(1)  # three workers and their daemons share a small box
    data = load(args.task)
    model = data.model(args.seed)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    run = Path(args.dir)
    try:
        trainer = Trainer(model, opt, samples_per_step=args.batch, timeout=300.0,
                          chunk_bytes=args.chunk or None)
    except ChaosError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    me = trainer.node_id
    gen = batch_generator(args.seed, int(me.lstrip("n") or 0))
    evals: list[dict[str, Any]] = []
    start = end = -1
    t0 = spent_eval = 0.0
    tx0 = 0
    began = -1  # the step this worker began training at (START unless it read it late)

    def evaluate() -> None:
        nonlocal spent_eval
        t = time.monotonic()
        shared = model
        if trainer._outer is not None:  # the bench's one look inside: the synced parameters
            shared = copy.deepcopy(model)
            torch.nn.utils.vector_to_parameters(trainer._outer.synced, shared.parameters())
        loss, acc = data.evaluate(shared, "test")
        val_loss, val_acc = data.evaluate(shared, "val")
        evals.append({"step": trainer.step - start, "t": round(t - t0 - spent_eval, 4),
                      "tx": data_tx_bytes() - tx0, "loss": loss, "acc": acc,
                      "val_loss": val_loss, "val_acc": val_acc})
        spent_eval += time.monotonic() - t

    outer, started = 1, False
    rounds: list[tuple[int, float]] = []  # (bytes sent, seconds) of each update() with a round
    while end < 0 or trainer.step < end:
        if start < 0 and (run / "start").exists():
            start = int((run / "start").read_text())
            end = start + args.steps
        if not started and start >= 0 and trainer.step >= start:
            # (A worker that read START late starts at its step; the bench reports it.)
            started, t0, tx0 = True, time.monotonic(), data_tx_bytes()
            began = trainer.step
            # Every-step warm-up rounds stepped Adam on zero gradients (its step count, and
            # so its bias correction, moved); every mode starts from a fresh Adam. All
            # members do this at START, so their states stay identical.
            opt.state.clear()
            if me == args.eval_node:
                evaluate()
        if not started:  # warm-up: no samples, so the parameters stay put
            opt.zero_grad(set_to_none=True)
            trainer.update(samples=0)
            trainer.check_state_replication()
            time.sleep(WARMUP_SLEEP_S)
            continue
        xb, yb = data.batch(gen, args.batch)
        data.loss(model, xb, yb).backward()
        u0, b0 = time.monotonic(), data_tx_bytes()
        trainer.update()
        du, db = time.monotonic() - u0, data_tx_bytes() - b0
        trainer.check_state_replication()
        o = trainer._outer
        outer = 1 if o is None else o.inner_steps
        if trainer.step % (1 if o is None else o.period) == 0:
            rounds.append((db, du))
        synced = trainer.step % outer == 0
        if me == args.eval_node and synced and (
                (trainer.step - start) % args.eval_every == 0 or outer > 1
                or trainer.step == end):
            evaluate()
    wall = time.monotonic() - t0 - spent_eval
    doc = {"node": me, "seed": args.seed, "chunk": args.chunk, "start": start, "began": began,
           "steps": args.steps, "inner_steps": outer,
           "wall_s": round(wall, 4), "tx_bytes": data_tx_bytes() - tx0, "evals": evals,
           "rounds": _peaks(rounds)}
    tmp = run / f".{me}.json"
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, run / f"{me}.json")
    time.sleep(1.0)  # the last round's COMMIT reaches every member before our links close
    trainer.close()
    return 0


def _peaks(rounds: list[tuple[int, float]]) -> dict[str, float | int]:
    """The largest and the median bytes and seconds of the rounds."""
    if not rounds:
        return {"n": 0}
    sent, secs = [b for b, _ in rounds], [s for _, s in rounds]
    return {"n": len(rounds), "bytes_max": max(sent), "bytes_median": statistics.median(sent),
            "s_max": round(max(secs), 4), "s_median": round(statistics.median(secs), 4)}


if __name__ == "__main__":
    sys.exit(main())
