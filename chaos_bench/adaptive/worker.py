"""The training worker of ``chaosctl bench adaptive``: one script for every policy.

A small character-level transformer (:mod:`chaos_edge.examples.chartf`, 114k parameters,
0.46 MB of float32 gradients) learns Python's help texts with Adam. The cluster's policy
(``[training]`` and, in the adaptive runs, the controller) decides how ``update()``
synchronises; the script does not know which, and may see it change during the run.

The bench runs on wall time, not on a step count: the links change on a schedule, and a
policy is judged by how far it trained in that time. So the worker never ends by itself: it
trains until the bench tears the testbed down, and writes as it goes:

- ``<dir>/<node>.steps.jsonl``: one line per step, ``{"step", "t", "mode"}`` (``t``: Unix
  time after the step's ``update()``; ``mode``: the sync mode the step ran under);
- on ``--eval-node``, every ``--snap-every-s`` seconds, ``<dir>/snap-NNNN.pt``: the step,
  the time and the parameters the members share (DiLoCo's synced ones, which every member
  holds alike; every-step's own). The bench evaluates them on the validation split after the
  run, so no evaluation runs inside the timed schedule. When ``<dir>/stop`` appears (the
  schedule ended) the eval node saves one last snapshot and writes ``<dir>/final``.

Until the global step named in ``<dir>/start`` (written once every node has joined) the
worker trains on no samples (``update(samples=0)``: nothing moves) so no node trains alone;
at that step every member clears Adam's state, as the slow-links worker does. From then on
each step takes ``--batch`` windows of its own. ``<dir>/slow-<node>``, while it exists, holds
milliseconds of extra compute per step (a box slowed by its owner's other work): the worker
sleeps that long before ``update()``, where its daemon counts it as compute.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

WARMUP_SLEEP_S = 0.05  # between no-sample steps: the bench needs time to name START
MODEL = {"d_model": 64, "layers": 2}
CHARS, CONTEXT = 48_000, 32


def parse(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description="Chaos adaptive bench worker.")
    ap.add_argument("--dir", required=True, help="the run's shared directory")
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0, help="initial weights and batch orders")
    ap.add_argument("--eval-node", default="n1")
    ap.add_argument("--snap-every-s", type=float, default=3.0)
    return ap.parse_args(argv)


def mode_label(trainer: Any) -> str:
    """The sync mode the trainer's rounds follow now (the bench's one look inside)."""
    m = trainer._replica.rhythm.mode
    if m.mode == "every-step":
        return m.mode
    return f"{m.mode} H={m.inner_steps}" + (f" P={m.fragments}" if m.mode == "streaming"
                                              else "")


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    import torch

    from chaos_bench.slowdown import SlowDown
    from chaos_edge import ChaosError, Trainer
    from chaos_edge.examples import chartf

    torch.set_num_threads(1)  # three workers and their daemons share a small box
    data = chartf.load(CHARS, CONTEXT)
    torch.manual_seed(args.seed)
    model = chartf.CharTransformer(len(data.vocab), data.context, **MODEL)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    run = Path(args.dir)
    try:
        trainer = Trainer(model, opt, samples_per_step=args.batch, timeout=300.0)
    except ChaosError as exc:
        print(f"{type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    me = trainer.node_id
    gen = torch.Generator().manual_seed(100_000 * args.seed + 1000 + int(me.lstrip("n") or 0))
    log = open(run / f"{me}.steps.jsonl", "a", buffering=1)  # noqa: SIM115 (lives with us)
    start, started, final = -1, False, False
    slow, next_snap, snaps = SlowDown(run / f"slow-{me}"), 0.0, 0

    def snapshot(last: bool) -> None:
        nonlocal snaps
        outer = trainer._outer
        params = (outer.synced if outer is not None
                  else torch.nn.utils.parameters_to_vector(model.parameters())).detach().clone()
        tmp = run / f".snap-{snaps:04d}.pt"
        torch.save({"step": trainer.step, "t": time.time(), "final": last, "params": params},
                   tmp)
        os.replace(tmp, run / f"snap-{snaps:04d}.pt")
        snaps += 1

    while True:
        if start < 0 and (run / "start").exists():
            start = int((run / "start").read_text())
        if not started and start >= 0 and trainer.step >= start:
            started = True
            opt.state.clear()  # warm-up rounds stepped Adam on zeros; every member clears it
            if me == args.eval_node:
                snapshot(False)
                next_snap = time.monotonic() + args.snap_every_s
        if not started:
            opt.zero_grad(set_to_none=True)
            trainer.update(samples=0)
            trainer.check_state_replication()
            time.sleep(WARMUP_SLEEP_S)
            continue
        x, y = chartf.batch(data, torch.randint(data.n_train, (args.batch,), generator=gen))
        chartf.loss_of(model, x, y).backward()
        slow.sleep()
        trainer.update()
        trainer.check_state_replication()
        log.write(json.dumps({"step": trainer.step, "t": round(time.time(), 4),
                              "mode": mode_label(trainer)}) + "\n")
        if me != args.eval_node or final:
            continue
        if (run / "stop").exists():
            snapshot(True)
            final = True
            (run / "final").write_text(str(trainer.step))
        elif time.monotonic() >= next_snap:
            snapshot(False)
            next_snap += args.snap_every_s


if __name__ == "__main__":
    sys.exit(main())
