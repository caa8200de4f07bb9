"""A plain PyTorch DDP script made elastic: four lines differ from the DDP original.

The lines marked ``# chaos`` are the change (the README shows the diff). Everything else is
what a DDP user has: the model with BatchNorm, SGD with momentum, a step LR schedule, clipping
of the averaged gradient, ``zero_grad()``, ``backward()`` and ``optimizer.step()``. Each node
trains on its own data (a regression task drawn from a stream seeded by its node id, as an edge
box holds its own), so nothing is downloaded.

    chaosctl join -- python -m chaos_edge.examples.ddp_mlp --steps 500

``--record FILE`` appends one JSON line per step: the step, the loss and the digest of the whole
replicated state (what the tests compare across members).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import torch

from chaos_edge import ChaosError, ddp  # chaos


def build(width: int) -> torch.nn.Module:
    return torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.BatchNorm1d(width),
                               torch.nn.Tanh(), torch.nn.Linear(width, 2))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos_edge.examples.ddp_mlp",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds to rest after a step")
    ap.add_argument("--record", default="", help="append a JSON line per step to this file")
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper(),
                        format="%(asctime)s %(name)s %(message)s")
    torch.manual_seed(0)  # every member builds the same model
    model = ddp.DistributedDataParallel(build(args.width))  # chaos: was DDP(...) after init
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=200, gamma=0.5)
    try:
        trainer = ddp.elastic(model, optimizer, state={"sched": scheduler},  # chaos
                              samples_per_step=args.batch)
    except ChaosError as exc:
        print(f"ddp_mlp: {exc}", file=sys.stderr)
        return 1
    w_true = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    data = torch.Generator().manual_seed(sum(map(ord, trainer.node_id)))
    out = open(args.record, "a") if args.record else None  # noqa: SIM115 (closed below)
    try:
        while trainer.step < args.steps:  # chaos: was for step in range(steps)
            x = torch.randn(args.batch, 8, generator=data)
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            if out is not None:
                out.write(json.dumps({"step": trainer.step, "loss": float(loss.detach()),
                                      "digest": trainer.state_digest()}) + "\n")
                out.flush()
            if args.sleep:
                time.sleep(args.sleep)
    finally:
        if out is not None:
            out.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
