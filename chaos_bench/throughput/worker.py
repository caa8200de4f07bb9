"""The worker of ``chaosctl bench throughput`` (``python -m chaos_bench.throughput.worker``).

One script for every arm, so that only the gradient exchange differs between them:

- ``ddp``: torch ``DistributedDataParallel`` over gloo (``init_process_group`` with a TCP
  store; the rank and world come from ``--rank``/``--world``/``--port``), as a DDP user runs it
  at its fastest: its defaults (25 MB buckets overlapped with backward, buffers broadcast from
  rank 0 every forward, which keeps them in sync as Chaos's averaging does) plus
  ``gradient_as_bucket_view=True``, which saves a copy of the gradients each way.
- ``chaos``: the :class:`~chaos_edge.Trainer` (``update()`` after the backward).
- ``chaos-overlap``: the Trainer with ``overlap=True`` (each round starts during backward).
- ``chaos-ddp``: :mod:`chaos_edge.ddp` (the round in DDP's communication hook).

The model, the batch (``--batch`` samples drawn from a generator seeded by the member's index),
Adam and the thread count are the same in every arm. Once every member is in (the Chaos arms
wait for ``--world`` members), the worker runs ``--warmup`` steps, then ``--steps`` timed
steps, and writes one JSON object to ``--out``: the seconds of the timed steps, the per-step
times and the model's size. Then it leaves (Chaos) or destroys its group (DDP).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

from chaos_bench.stall.worker import build
from chaos_bench.throughput import ARMS, MODELS


def draw_batch(draw: Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]],
               gen: torch.Generator, batch: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``batch`` samples, a multiple of 16 (the model's draw gives 16 at a time)."""
    parts = [draw(gen) for _ in range(batch // 16)]
    return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])


def planned(trainer: object) -> tuple[str, ...]:
    """The members of the newest policy the worker knows (planned, maybe not yet in force)."""
    newest = trainer._s.book.newest  # type: ignore[attr-defined]
    return tuple(newest.members) if newest is not None else ()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Chaos throughput bench worker.")
    ap.add_argument("--arm", choices=ARMS, required=True)
    ap.add_argument("--model", choices=MODELS, default="cnn")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--rank", type=int, default=0, help="ddp: this process's rank")
    ap.add_argument("--port", type=int, default=0, help="ddp: the TCP store's port")
    ap.add_argument("--host", default="", help="ddp on the testbed: this node's data address, "
                    "which gloo binds (rank 0 hosts the store there)")
    ap.add_argument("--master", default="127.0.0.1", help="ddp: the store's address")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper())
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)  # the same model everywhere
    model, draw, loss_fn = build(args.model, 16)
    params = sum(p.numel() for p in model.parameters())
    net: torch.nn.Module = model
    trainer = None
    if args.arm == "ddp":
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        group = None
        if args.host:  # a namespace with a link per peer: gloo must bind the data address
            group = _bound_group(args.host, args.master, args.port, args.rank, args.world)
        else:
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{args.port}",
                                    rank=args.rank, world_size=args.world)
        # DDP at its fastest: its gradients are views of its buckets, as chaos-ddp's are.
        net = DistributedDataParallel(model, gradient_as_bucket_view=True, process_group=group)
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        me = args.rank
    elif args.arm in ("chaos", "chaos-overlap"):
        from chaos_edge import Trainer

        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        trainer = Trainer(model, opt, samples_per_step=args.batch,
                          overlap=args.arm == "chaos-overlap")
    else:
        from chaos_edge import ddp

        net = ddp.DistributedDataParallel(model)
        opt = torch.optim.Adam(net.parameters(), lr=1e-3)
        trainer = ddp.elastic(net, opt, samples_per_step=args.batch)
    if trainer is not None:
        me = int("".join(c for c in trainer.node_id if c.isdigit()))  # node-3, n3: 3
        # Every member planned in before the first step, so all are in by the end of the
        # warm-up (a join takes effect a few steps after it is planned).
        while trainer.step == 0 and len(planned(trainer)) < args.world:
            trainer.check_state_replication()
            time.sleep(0.01)
    gen = torch.Generator().manual_seed(1000 + me)
    times: list[float] = []
    backward: list[float] = []  # the step up to the end of backward()
    short: list[int] = []  # timed steps with fewer members than --world (an error)
    ran, end = 0, args.warmup + args.steps
    # Chaos counts the cluster's steps, so every member times the same global steps; two
    # untimed steps after them keep a member that is done from leaving mid-window.
    while (trainer.step if trainer is not None else ran) < end + (2 if trainer else 0):
        t0 = time.perf_counter()
        x, y = draw_batch(draw, gen, args.batch)
        if args.arm in ("chaos", "chaos-overlap"):
            assert trainer is not None
            loss_fn(net(x), y).backward()
            t1 = time.perf_counter()
            trainer.update()
            trainer.check_state_replication()
        else:
            opt.zero_grad()
            loss_fn(net(x), y).backward()  # chaos-ddp and ddp: the exchange runs in here
            t1 = time.perf_counter()
            opt.step()
        ran += 1
        step = trainer.step if trainer is not None else ran
        if args.warmup < step <= end:
            t2 = time.perf_counter()
            times.append(t2 - t0)
            backward.append(t1 - t0)
            if trainer is not None and len(trainer.shard.members) < args.world:
                short.append(step)
    newest = trainer._s.book.newest if trainer is not None else None
    doc = {"arm": args.arm, "model": args.model, "parameters": params, "batch": args.batch,
           # the policy the rounds ran under at the end: its wire format and chunk size
           "policy": None if newest is None else {"wire": newest.wire,
                                                  "chunk_kib": newest.chunk_kib,
                                                  "tree": [list(e) for e in newest.edges]},
           "member": me, "short_steps": short, "steps": args.steps, "seconds": sum(times),
           "step_s": [round(t, 6) for t in times],
           "to_backward_end_s": [round(t, 6) for t in backward],
           "members": args.world if trainer is None else len(trainer.shard.members)}
    with open(args.out, "w") as f:
        json.dump(doc, f)
    if trainer is not None:
        trainer.close()
    elif not args.host:
        import torch.distributed as dist

        dist.destroy_process_group()
    return 0


def _bound_group(host: str, master: str, port: int, rank: int, world: int) -> Any:
    """A gloo process group whose device binds ``host``: what ``init_process_group`` builds,
    but on the node's data address (its default device picks the hostname's)."""
    from datetime import timedelta

    import torch.distributed as dist

    store = dist.TCPStore(master, port, world, rank == 0, timedelta(seconds=60))
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in the stubs
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = timedelta(seconds=60)
    pg = dist.ProcessGroup(store, rank, world)
    pg._register_backend(torch.device("cpu"), dist.ProcessGroup.BackendType.GLOO,
                         dist.ProcessGroupGloo(store, rank, world, opts))
    pg._set_default_backend(dist.ProcessGroup.BackendType.GLOO)
    return pg


if __name__ == "__main__":
    sys.exit(main())
