"""The training worker the stall bench runs (``python -m chaos_bench.stall.worker``).

A tiny deterministic model trained with the Trainer API; the training tests run the same
script (``tests/training/_worker.py`` calls :func:`main`). Writes one JSON line per committed
step to ``--out``: ``{"step", "digest", "loss", "stall_ms", "update_ms", "reruns",
"policy_version"}``. ``--fault EVENT:INDEX:FROM_STEP`` kills this process with SIGKILL at the
first data-plane hook ``EVENT`` with ``INDEX`` once round ``FROM_STEP`` or later runs (fault
injection); ``--freeze EVENT:INDEX:FROM_STEP`` stops it there with SIGSTOP instead, once (a
box that freezes: no reset, and it goes on when thawed); ``--stall EVENT:INDEX:SECONDS[:MEMBERS]``
sleeps there instead, while a planned change waits (one with at least ``MEMBERS`` members, if
given).
"""

from __future__ import annotations

import argparse
import faulthandler
import json
import logging
import os
import signal
import sys
import time

import torch

from chaos_edge import Trainer, capture_exit_event


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
    ap.add_argument("--leave-at", type=int, default=-1)
    ap.add_argument("--width", type=int, default=16, help="hidden units (state size)")
    ap.add_argument("--chunk", type=int, default=256, help="all-reduce chunk bytes")
    ap.add_argument("--timeout", type=float, default=60.0, help="the Trainer's step timeout")
    ap.add_argument("--digest-every", type=int, default=None,
                    help="the divergence guard's period (default: the Trainer's)")
    args = ap.parse_args(argv)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand
    level = os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper()  # INFO when debugging
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(message)s")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.Tanh(),
                                torch.nn.Linear(args.width, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    guard = {} if args.digest_every is None else {"digest_every": args.digest_every}
    trainer = Trainer(model, opt, samples_per_step=16, chunk_bytes=args.chunk,
                      timeout=args.timeout,
                      **guard)
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
    w_true = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    with open(args.out, "a") as out:
        while trainer.step < args.steps:
            while trainer.step == 0 and trainer._s.book.newest is not None and len(
                    trainer._s.book.newest.members) < args.wait_members:
                trainer.check_state_replication()
                time.sleep(0.01)
            x = torch.randn(16, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
            loss.backward()
            trainer.update()
            trainer.check_state_replication()
            t = trainer.stalls[-1]
            out.write(json.dumps({"step": trainer.step, "digest": trainer.state_digest(),
                                  "loss": float(loss.detach()), "stall_ms": round(t.stall_ms, 4),
                                  "update_ms": round(t.total_ms, 4), "reruns": t.reruns,
                                  "policy_version": trainer.policy_version}) + "\n")
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
