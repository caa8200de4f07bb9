"""The soak test's training worker (``python -m chaos_bench.soak.worker``).

A tiny model trained with the Trainer API until a leave. Each process writes
``<records>/<node>.<pid>.jsonl``: first the state it starts from (``{"t", "step", "joins",
"digest", "start": true}``), then one line per committed step: ``{"t", "step", "joins",
"digest", "loss"}``; ``joins`` counts the Trainer's joins, so a rejoin inside one process
(after a freeze, say) is visible.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path


def worker(argv: list[str] | None = None) -> int:
    """The training worker: a tiny model, one JSON line per committed step, until a leave."""
    ap = argparse.ArgumentParser(description="Chaos soak-test training worker.")
    ap.add_argument("--out", required=True, help="directory of the step records")
    ap.add_argument("--sleep", type=float, default=0.05, help="seconds between steps")
    ap.add_argument("--width", type=int, default=16, help="hidden units")
    args = ap.parse_args(argv)
    import faulthandler
    import logging

    # chaosd hands the worker's stderr to worker.log: with times, its lines can be read
    # beside the daemons' logs when a soak violation is traced (stop 33's stalls could not).
    logging.basicConfig(level=os.environ.get("CHAOS_WORKER_LOG", "INFO").upper(),
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")

    import torch

    from chaos_edge import Trainer, capture_exit_event

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # stacks on demand
    torch.set_num_threads(1)  # many processes share two cores
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, args.width), torch.nn.Tanh(),
                                torch.nn.Linear(args.width, 2))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    trainer = Trainer(model, opt, samples_per_step=16, timeout=60.0)
    gen = torch.Generator().manual_seed(os.getpid())
    w_true = torch.randn(8, 2, generator=torch.Generator().manual_seed(1))
    path = Path(args.out) / f"{trainer.node_id}.{os.getpid()}.jsonl"
    with open(path, "a") as out:
        # The state this process starts from (a replica, a snapshot, or a fresh model).
        out.write(json.dumps({"t": round(time.time(), 3), "step": trainer.step,
                              "joins": trainer.joins, "digest": trainer.state_digest(),
                              "start": True}) + "\n")
        while True:
            x = torch.randn(16, 8, generator=gen)
            loss = torch.nn.functional.mse_loss(model(x), x @ w_true)
            loss.backward()
            trainer.update()
            trainer.check_state_replication()
            out.write(json.dumps({"t": round(time.time(), 3), "step": trainer.step,
                                  "joins": trainer.joins,
                                  "digest": trainer.state_digest(),
                                  "loss": round(float(loss.detach()), 6)}) + "\n")
            out.flush()
            if capture_exit_event():
                trainer.request_node_exit()
                return 0
            time.sleep(args.sleep)


if __name__ == "__main__":
    sys.exit(worker())
