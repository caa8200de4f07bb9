"""Train a small MLP on scikit-learn's bundled digits across a Chaos cluster (offline data).

Each node trains on its own shard, as an edge box holds its own data: sample ``i`` belongs
to the node whose id hashes to ``i mod --shards``. Gradients are averaged by the global sample
count, so uneven shards still give the true mean. Needs scikit-learn (the ``examples`` extra).

    chaosctl join -- python -m chaos_edge.examples.digits --steps 500
"""

from __future__ import annotations

import argparse
import faulthandler
import hashlib
import importlib.util
import logging
import os
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from chaos_edge import ChaosError, Trainer, capture_exit_event


def shard(node_id: str, shards: int, n: int) -> np.ndarray:
    """Indices of this node's shard (stable across restarts: a hash of the node id)."""
    mine = int.from_bytes(hashlib.sha256(node_id.encode()).digest()[:4], "big") % shards
    return np.arange(n)[np.arange(n) % shards == mine]


def arrays() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: (1797, 64) pixels 0..16 and their labels, offline.

    Read from the table scikit-learn ships, as its ``load_digits`` reads it, without importing
    scikit-learn: that import costs a worker 1-2 s of CPU on a small box, at every start. Where
    the table is not where scikit-learn keeps it, its own loader."""
    spec = importlib.util.find_spec("sklearn")  # imports nothing for a top-level package
    where = spec.submodule_search_locations if spec is not None else None
    if where:
        table = Path(next(iter(where))) / "datasets" / "data" / "digits.csv.gz"
        if table.is_file():
            rows = np.loadtxt(table, delimiter=",")
            return rows[:, :-1], rows[:, -1].astype(int)
    from sklearn.datasets import load_digits  # the optional extra, imported where it is used

    d = load_digits()
    return np.asarray(d.data), np.asarray(d.target)


def load() -> tuple[torch.Tensor, torch.Tensor]:
    """The digits as (features scaled to [0, 1], labels)."""
    x, y = arrays()
    return torch.tensor(x / 16.0, dtype=torch.float32), torch.tensor(y, dtype=torch.long)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos_edge.examples.digits",
                                 description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--steps", type=int, default=500)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--log-every", type=int, default=25)
    args = ap.parse_args(argv)
    # CHAOS_WORKER_LOG=info shows the Trainer's joins, offers and policy switches.
    level = os.environ.get("CHAOS_WORKER_LOG", "WARNING").upper()
    logging.basicConfig(level=level, format="%(asctime)s %(name)s: %(message)s")
    # kill -USR1 <pid> writes every thread's stack to stderr: where a stalled worker waits.
    faulthandler.register(signal.SIGUSR1, all_threads=True)

    try:
        x_all, y_all = load()
    except ImportError:
        print("digits: needs scikit-learn: pip install 'chaos-edge[examples]'", file=sys.stderr)
        return 2
    torch.manual_seed(0)  # every node builds the same model; the cluster's state wins anyway
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    try:
        trainer = Trainer(model, opt, samples_per_step=args.batch)
    except ChaosError as exc:  # chaosd unreachable, or the join failed
        print(f"digits: {exc}", file=sys.stderr)
        return 1
    idx = shard(trainer.node_id, args.shards, len(y_all))
    x, y = x_all[idx], y_all[idx]
    gen = torch.Generator().manual_seed(trainer.step)
    print(f"{trainer.node_id}: {len(idx)} samples, starting at step {trainer.step}", flush=True)
    window: list[float] = []
    while trainer.step < args.steps:
        pick = torch.randint(len(y), (args.batch,), generator=gen)
        loss = torch.nn.functional.cross_entropy(model(x[pick]), y[pick])
        loss.backward()
        trainer.update(samples=args.batch)
        trainer.check_state_replication()
        window.append(float(loss.detach()))
        if trainer.step % args.log_every == 0:
            with torch.no_grad():
                acc = (model(x_all).argmax(1) == y_all).float().mean().item()
            print(f"step {trainer.step} loss {np.mean(window):.4f} acc {acc:.3f}", flush=True)
            window.clear()
        if capture_exit_event():
            trainer.request_node_exit()
            print(f"{trainer.node_id}: left at step {trainer.step}", flush=True)
            return 0
    trainer.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
