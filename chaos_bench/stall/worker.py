"""The training worker the stall bench runs (``python -m chaos_bench.stall.worker``).

A deterministic model trained with the Trainer API; the training tests run the same script
(``tests/training/_worker.py`` calls :func:`main`). ``--model`` picks it: ``mlp`` (the tests'
tiny MLP, ``--width`` hidden units), ``cnn`` (the digits CNN of :mod:`chaos_edge.examples.cnn`
on random 8x8 images: the stall does not depend on the pixels, and this keeps scikit-learn
out), ``chartf`` (the character transformer of :mod:`chaos_edge.examples.chartf` on its text)
or ``dense-25m`` (five 2240x2240 linear layers, 25.1M parameters: a state of 100 MB, 300 MB
with Adam's moments). Writes one JSON line per committed step to ``--out``: ``{"step",
"digest", "loss", "stall_ms", "optimizer_ms", "update_ms", "reruns", "policy_version"}``
(``--no-digest`` leaves ``digest`` out: SHA-256 over a large state every step is the
tests' check, not a cost of training).

``--fault EVENT:INDEX:FROM_STEP`` kills this process with SIGKILL at the first data-plane
hook ``EVENT`` with ``INDEX`` once round ``FROM_STEP`` or later runs (fault injection);
``--freeze EVENT:INDEX:FROM_STEP`` stops it there with SIGSTOP instead, once (a box that
freezes: no reset, and it goes on when thawed); ``--stall EVENT:INDEX:SECONDS[:MEMBERS]``
sleeps there instead, while a planned change waits (one with at least ``MEMBERS`` members,
if given).
"""

from __future__ import annotations

import argparse
import faulthandler
import itertools
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from chaos_bench.slowdown import SlowDown
from chaos_bench.stall import MODELS
from chaos_edge import Trainer, capture_exit_event
from chaos_edge.examples import chartf, cnn

Batch = Callable[[torch.Generator], tuple[torch.Tensor, torch.Tensor]]
DENSE_WIDTH, DENSE_LAYERS = 2240, 5


def build(name: str, width: int) -> tuple[torch.nn.Module, Batch, Callable[..., torch.Tensor]]:
    """The model, a batch of 16 samples drawn from a generator, and the loss."""
    mse, xent = torch.nn.functional.mse_loss, torch.nn.functional.cross_entropy
    if name == "cnn":
        model: torch.nn.Module = cnn.DigitsCNN()
        return (model, lambda g: (torch.rand(16, 1, 8, 8, generator=g) * 2 - 1,
                                  torch.randint(0, 10, (16,), generator=g)), xent)
    if name == "chartf":
        text = chartf.load()
        model = chartf.CharTransformer(len(text.vocab), text.context)

        def windows(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
            x, y = chartf.batch(text, torch.randint(0, text.n_train, (16,), generator=g))
            return x, y.reshape(-1)

        return model, windows, lambda out, y: xent(out.reshape(-1, out.shape[-1]), y)
    dims = [DENSE_WIDTH] * (DENSE_LAYERS + 1) if name == "dense-25m" else [8, width, 2]
    layers: list[torch.nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [torch.nn.Linear(a, b), torch.nn.Tanh()]
    model = torch.nn.Sequential(*layers[:-1])
    w_true = torch.randn(dims[0], dims[-1], generator=torch.Generator().manual_seed(1))
    if name == "dense-25m":
        w_true /= DENSE_WIDTH**0.5  # targets of unit scale

    def regression(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.randn(16, dims[0], generator=g)
        return x, x @ w_true

    return model, regression, mse


def main(argv: list[str] | None = None) -> int:
    """Train until ``--steps`` (or a leave); returns the exit status."""
    ap = argparse.ArgumentParser(description="Chaos bench/test training worker.")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--out", required=True)
    ap.add_argument("--fault", default="")
    ap.add_argument("--freeze", default="", help="EVENT:INDEX:FROM_STEP: SIGSTOP there once")
    ap.add_argument("--stall", default="",
                    help="EVENT:INDEX:SECONDS[:MEMBERS]: sleep at that data-plane hook while a "
                         "newer policy (of at least MEMBERS members) waits to take effect (a "
                         "slow link as a planned change lands)")
    ap.add_argument("--wait-members", type=int, default=1)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--slow-file", default="",
                    help="while this file exists, milliseconds of extra compute a step (a box "
                         "slowed by its owner's other work)")
    ap.add_argument("--leave-at", type=int, default=-1)
    ap.add_argument("--model", choices=MODELS, default="mlp")
    ap.add_argument("--width", type=int, default=16, help="the mlp's hidden units")
    ap.add_argument("--threads", type=int, default=0,
                    help="torch's intra-op threads (0: torch's default). The bench runs several "
                         "workers on one box: one thread each keeps their thread pools from "
                         "spinning against each other, as separate boxes would not")
    ap.add_argument("--digest", action=argparse.BooleanOptionalAction, default=True,
                    help="write the state's digest in every row (the tests' check)")
    ap.add_argument("--chunk", type=int, default=256,
                    help="all-reduce chunk bytes (0: the Trainer's default, sized by the vector)")
    ap.add_argument("--timeout", type=float, default=60.0, help="the Trainer's step timeout")
    ap.add_argument("--overlap", action="store_true",
                    help="start each round during backward (Trainer(overlap=True))")
    ap.add_argument("--digest-every", type=int, default=None,
                    help="the divergence guard's period (default: the Trainer's)")
    args = ap.parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand
    level = os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper()  # INFO when debugging
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model, draw, loss_fn = build(args.model, args.width)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    guard = {} if args.digest_every is None else {"digest_every": args.digest_every}
    trainer = Trainer(model, opt, samples_per_step=16, chunk_bytes=args.chunk or None,
                      timeout=args.timeout, overlap=args.overlap, **guard)
    node = trainer.node_id
    if args.fault or args.freeze:
        event, index, from_step = (args.fault or args.freeze).split(":")
        sig, fired = (signal.SIGKILL if args.fault else signal.SIGSTOP), [False]

        def hook(ev: str, i: int) -> None:
            if (ev == event and i == int(index) and trainer.step + 1 >= int(from_step)
                    and not fired[0]):
                fired[0] = True
                os.kill(os.getpid(), sig)

        trainer.reducer.fault_hook = hook
    if args.stall:
        s_event, index_s, seconds_s, *at_least = args.stall.split(":")
        s_index, seconds = int(index_s), float(seconds_s)
        min_members = int(at_least[0]) if at_least else 0

        def stall(ev: str, i: int) -> None:
            book = trainer._s.book
            now, newest = book.for_round(trainer.step + 1), book.newest
            if (ev == s_event and i == s_index and now is not None
                    and newest is not None and newest.version > now.version
                    and len(newest.members) >= min_members):
                time.sleep(seconds)

        trainer.reducer.fault_hook = stall
    gen = torch.Generator().manual_seed(sum(map(ord, node)))
    slow = SlowDown(Path(args.slow_file)) if args.slow_file else None
    with open(args.out, "a") as out:
        while trainer.step < args.steps:
            while trainer.step == 0 and trainer._s.book.newest is not None and len(
                    trainer._s.book.newest.members) < args.wait_members:
                trainer.check_state_replication()
                time.sleep(0.01)
            x, y = draw(gen)
            loss = loss_fn(model(x), y)
            loss.backward()
            if slow is not None:
                slow.sleep()
            trainer.update()
            trainer.check_state_replication()
            t = trainer.stalls[-1]
            row: dict[str, object] = {"step": trainer.step, "loss": float(loss.detach()),
                   "stall_ms": round(t.stall_ms, 4), "optimizer_ms": round(t.optimizer_ms, 4),
                   "update_ms": round(t.total_ms, 4), "reruns": t.reruns,
                   "policy_version": trainer.policy_version}
            if args.digest:
                row["digest"] = trainer.state_digest()
            out.write(json.dumps(row) + "\n")
            out.flush()
            if args.sleep:
                time.sleep(args.sleep)
            if capture_exit_event() or trainer.step == args.leave_at:
                trainer.request_node_exit()
                return 0
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
