"""One process of the all-reduce bench (``python -m chaos_bench.allreduce.worker``).

It holds one gradient and runs, on request, either Chaos's all-reduce (``AllReducer`` over
``PeerLinks``) or ``torch.distributed``'s gloo ``allreduce`` (SUM, then divide by the world
size: gloo has no AVG) on that same gradient, so both are timed in the same process on the same
bytes. It speaks JSON lines: stdout carries its answers, stdin the parent's requests:

1. it prints ``{"addr": [host, port], "store_port": P}`` (``P`` only on rank 0, which hosts the
   gloo TCPStore on its data address);
2. it reads ``{"peers": {node: [host, port]}, "ranks": {node: rank}, "policies": {name:
   {...}}, "store": [host, port]}``, dials its neighbours of higher rank in any of the trees,
   joins the gloo group (bound to ``--host``, so in a namespace gloo uses the node's data
   address), and prints ``{"ready": true}``;
3. then for each ``chaos:NAME`` (a policy of the setup, whose ``wire`` is the format) or
   ``gloo`` line it runs one round and prints ``{"start", "end", "cpu", "checksum", "diff",
   "err", "sent", "tx"}``: wall times (``time.perf_counter``, one clock for every namespace),
   CPU seconds of the whole process (every thread, gloo's included), the float64 sum of the
   result (equal on every member when results are bit-identical), for gloo the largest
   difference from this process's last fp32 Chaos result, for a compressed Chaos round the
   largest difference from the last gloo result (the format's error), the bytes Chaos's links
   sent (headers included; None for gloo), and the bytes this network namespace's interfaces
   other than ``lo`` sent (``/proc/net/dev``: on the mesh every byte to another node, on
   loopback 0). ``quit`` ends it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from chaos_bench.workers import answer, tx_bytes
from chaos_edge.dataplane import AllReducer, LinkConfig, PeerLinks, SyncPolicy

SECRET = b"bench"


def _read() -> Any:
    line = sys.stdin.readline()
    if not line:
        raise SystemExit(0)  # the parent went away
    text = line.strip()
    return json.loads(text) if text.startswith("{") else text


def _gloo(host: str, store: dist.TCPStore, rank: int, world: int, timeout_s: float
          ) -> dist.ProcessGroupGloo:
    """A gloo group whose device binds ``host`` (the node's data address)."""
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # not in the stubs
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
    opts._timeout = datetime.timedelta(seconds=timeout_s)
    return dist.ProcessGroupGloo(store, rank, world, opts)


class Worker:
    """The gradient, both all-reduces, and the bookkeeping of one process."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.node, self.rank, self.world = args.node, args.rank, args.world
        self.links = PeerLinks(self.node, "bench", SECRET, is_member=lambda p: True,
                               host=args.host, config=LinkConfig(sock_buf=args.sock_buf))
        self.store: dist.TCPStore | None = None
        if self.rank == 0:  # the master must exist before the others connect
            self.store = dist.TCPStore(args.host, 0, self.world, True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=args.timeout))
        rng = np.random.default_rng(1000 + self.rank)
        self.grad = rng.standard_normal(args.elems, dtype=np.float32)
        self.out = np.empty_like(self.grad) if args.reuse else None
        # Each round starts by copying grad into its input buffer, untimed and alike for both
        # (gloo reduces in place, so it needs the copy; Chaos gets the same cache state).
        self.work = torch.empty(args.elems, dtype=torch.float32)
        self.send = np.empty_like(self.grad)
        self.scratch = np.empty_like(self.grad)
        self.last_chaos: np.ndarray | None = None  # of the last fp32 round
        self.has_gloo = False  # whether self.work holds a gloo result
        self.step = 0
        self.policies: dict[str, SyncPolicy] = {}
        self.reducer: AllReducer | None = None
        self.pg: dist.ProcessGroupGloo | None = None

    def announce(self) -> None:
        """Listen, and tell the parent where (and where the TCPStore is)."""
        self.links.allow(*[f"n{k}" for k in range(64)])  # anyone of the bench; auth still runs
        host, port = self.links.start()
        answer({"addr": [host, port], "store_port": self.store.port if self.store else None})

    def connect(self, setup: dict[str, Any]) -> None:
        """Dial tree neighbours, join the gloo group, wait for every link."""
        a = self.args
        self.policies = {k: SyncPolicy.from_dict(d) for k, d in setup["policies"].items()}
        peers = {n: (str(h), int(p)) for n, (h, p) in setup["peers"].items()}
        ranks = setup["ranks"]
        nbrs = sorted({p for pol in self.policies.values() for e in pol.edges for p in e
                       if self.node in e and p != self.node})
        for peer in nbrs:
            if ranks[peer] > self.rank:
                self.links.connect_to(peer, *peers[peer])
        if self.store is None:
            host, port = setup["store"]
            self.store = dist.TCPStore(host, int(port), self.world, False,
                                       timeout=datetime.timedelta(seconds=a.timeout))
        self.pg = _gloo(a.host, self.store, self.rank, self.world, a.timeout)
        if not self.links.wait_connected(nbrs, a.timeout):
            raise SystemExit(f"{self.node}: links to {nbrs} did not come up")
        self.reducer = AllReducer(self.links, chunk_bytes=(a.chunk_kb << 10) or None,
                                  timeout=a.timeout)
        answer({"ready": True})

    def chaos(self, name: str) -> dict[str, Any]:
        """One Chaos round under the named policy (its tree and wire format; equal weights:
        ``--samples`` per node)."""
        assert self.reducer is not None
        policy = self.policies[name]
        np.copyto(self.send, self.grad)
        sent0, tx0 = self.links.traffic()[0], tx_bytes()
        c0, start = time.process_time(), time.perf_counter()
        res = self.reducer.allreduce(self.send, self.args.samples, step=self.step,
                                     policy=policy, out=self.out)
        end, cpu = time.perf_counter(), time.process_time() - c0
        sent, tx = self.links.traffic()[0] - sent0, tx_bytes() - tx0
        self.step += 1
        values = np.asarray(res.values)
        err = None
        if policy.wire == "fp32":
            if self.last_chaos is None:
                self.last_chaos = np.empty_like(values)
            np.copyto(self.last_chaos, values)
        elif self.has_gloo:
            err = self._maxdiff(values, self.work.numpy())
        return {"start": start, "end": end, "cpu": cpu,
                "checksum": float(values.sum(dtype=np.float64)), "diff": None, "err": err,
                "sent": sent, "tx": tx}

    def _maxdiff(self, a: np.ndarray, b: np.ndarray) -> float:
        """max |a - b|, in place: no 100 MB temporaries between rounds."""
        np.subtract(a, b, out=self.scratch)
        return float(np.max(np.abs(self.scratch, out=self.scratch)))

    def gloo(self) -> dict[str, Any]:
        """One gloo round: SUM in place, then divide by the world size."""
        assert self.pg is not None
        self.work.copy_(torch.from_numpy(self.grad))  # untimed: every round starts from grad
        tx0 = tx_bytes()
        c0, start = time.process_time(), time.perf_counter()
        self.pg.allreduce([self.work]).wait()  # type: ignore[attr-defined]  # dist.all_reduce
        self.work.div_(self.world)
        end, cpu = time.perf_counter(), time.process_time() - c0
        tx = tx_bytes() - tx0
        self.has_gloo = True
        values = self.work.numpy()
        diff = None if self.last_chaos is None else self._maxdiff(values, self.last_chaos)
        return {"start": start, "end": end, "cpu": cpu,
                "checksum": float(values.sum(dtype=np.float64)), "diff": diff, "err": None,
                "sent": None, "tx": tx}

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()
        self.links.close()
        if self.pg is not None:
            self.pg.shutdown()


def main(argv: list[str] | None = None) -> int:
    """Serve the parent's requests until ``quit``."""
    ap = argparse.ArgumentParser(description="One process of chaosctl bench allreduce.")
    ap.add_argument("--node", required=True)
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--host", default="127.0.0.1", help="data address to bind")
    ap.add_argument("--elems", type=int, required=True, help="float32 gradient elements")
    ap.add_argument("--chunk-kb", type=int, default=1024, help="0: sized by the vector")
    ap.add_argument("--sock-buf", type=int, default=0)
    ap.add_argument("--reuse", action="store_true", help="pass the same out= every round")
    ap.add_argument("--samples", type=int, default=1,
                    help="samples per node: 1 is gloo's plain average; more weights it alike")
    ap.add_argument("--timeout", type=float, default=120.0)
    args = ap.parse_args(argv)
    torch.set_num_threads(1)  # the bench's processes share the cores; no intra-op pools
    w = Worker(args)
    try:
        w.announce()
        w.connect(_read())
        while True:
            cmd = _read()
            if cmd.startswith("chaos:"):
                answer(w.chaos(cmd[6:]))
            elif cmd == "gloo":
                answer(w.gloo())
            elif cmd == "quit":
                return 0
            else:
                raise SystemExit(f"unknown request {cmd!r}")
    finally:
        w.close()


if __name__ == "__main__":
    sys.exit(main())
