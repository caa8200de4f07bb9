"""One process of the all-reduce bench (``python -m chaos_bench.allreduce.worker``).

It holds one gradient and runs, on request, either Chaos's all-reduce (``AllReducer`` over
``PeerLinks``) or ``torch.distributed``'s gloo ``allreduce`` on that same gradient, so both are
timed in the same process on the same bytes. gloo sums a gradient already divided by the world
size, untimed, as DDP does (gloo has no AVG); Chaos averages inside its own pipeline, timed.
With ``--gloo-only`` the process holds no Chaos links at all: the gloo that nothing else
shares a process with, the baseline at its best.

Every round's input is new: round ``r`` scales the gradient by :func:`scale` ``(r)`` (untimed),
so a round that wrote nothing, or wrote the last round's result, fails the check. Each process
knows every rank's gradient (they come from fixed seeds), so it checks every result against
the exact average, scaled, element by element.

It speaks JSON lines: stdout carries its answers, stdin the parent's requests:

1. it prints ``{"addr": [host, port], "store_port": P}`` (``P`` only on rank 0, which hosts the
   gloo TCPStore on its data address; ``port`` is 0 with ``--gloo-only``);
2. it reads ``{"peers": {node: [host, port]}, "ranks": {node: rank}, "policies": {name:
   {...}}, "store": [host, port]}``, dials its neighbours of higher rank in any of the trees,
   joins the gloo group (bound to ``--host``, so in a namespace gloo uses the node's data
   address), and prints ``{"ready": true}``;
3. then for each ``chaos:NAME`` (a policy of the setup, whose ``wire`` is the format), ``gloo``
   or ``gloo-rooted`` (reduce to rank 0, then broadcast) line it runs one round and prints
   ``{"start", "end", "cpu", "checksum", "err", "sent", "tx"}``: wall times
   (``time.perf_counter``, one clock for every namespace), CPU seconds of the whole process
   (every thread, gloo's included), the float64 sum of the result (equal on every member when
   results are bit-identical), the largest difference from the exact average (float32 rounding
   for fp32; the format's error for a compressed wire), the bytes Chaos's links sent (headers
   included; None for gloo), and the bytes this network namespace's interfaces other than ``lo``
   sent (``/proc/net/dev``: on the mesh every byte to another node, on loopback 0). ``quit``
   ends it.
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


def scale(round_no: int) -> float:
    """The factor of round ``round_no``'s input: consecutive rounds differ by at least 1/8,
    so the last round's result is far outside the tolerance."""
    return 1.0 + ((round_no % 7) + 1) / 8


def gradient(rank: int, elems: int) -> np.ndarray:
    """Rank ``rank``'s gradient (float32, fixed seed: every process can rebuild it)."""
    return np.random.default_rng(1000 + rank).standard_normal(elems, dtype=np.float32)


def exact_average(world: int, elems: int) -> np.ndarray:
    """The average of every rank's gradient, summed in float64, rounded once to float32."""
    acc = np.zeros(elems, dtype=np.float64)
    for rank in range(world):
        acc += gradient(rank, elems)
    acc /= world
    return acc.astype(np.float32)


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
        self.links = None if args.gloo_only else PeerLinks(
            self.node, "bench", SECRET, is_member=lambda p: True, host=args.host,
            config=LinkConfig(sock_buf=args.sock_buf))
        self.store: dist.TCPStore | None = None
        if self.rank == 0:  # the master must exist before the others connect
            self.store = dist.TCPStore(args.host, 0, self.world, True, wait_for_workers=False,
                                       timeout=datetime.timedelta(seconds=args.timeout))
        self.grad = gradient(self.rank, args.elems)
        self.expect = exact_average(self.world, args.elems)
        self.out = np.empty_like(self.grad) if args.reuse else None
        # Each round starts by writing its scaled input into a buffer of its own, untimed and
        # alike for both (gloo reduces in place, so it needs the copy; Chaos gets the same
        # cache state).
        self.work = torch.empty(args.elems, dtype=torch.float32)
        self.send = np.empty_like(self.grad)
        self.scratch = np.empty_like(self.grad)
        self.round = 0  # counts every round, of either kind, alike in every process
        self.policies: dict[str, SyncPolicy] = {}
        self.reducer: AllReducer | None = None
        self.pg: dist.ProcessGroupGloo | None = None

    def announce(self) -> None:
        """Listen, and tell the parent where (and where the TCPStore is)."""
        host, port = self.args.host, 0
        if self.links is not None:
            self.links.allow(*[f"n{k}" for k in range(64)])  # anyone of the bench; auth runs
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
                assert self.links is not None  # a --gloo-only process gets no policies
                self.links.connect_to(peer, *peers[peer])
        if self.store is None:
            host, port = setup["store"]
            self.store = dist.TCPStore(host, int(port), self.world, False,
                                       timeout=datetime.timedelta(seconds=a.timeout))
        self.pg = _gloo(a.host, self.store, self.rank, self.world, a.timeout)
        if self.links is not None:
            if not self.links.wait_connected(nbrs, a.timeout):
                raise SystemExit(f"{self.node}: links to {nbrs} did not come up")
            self.reducer = AllReducer(self.links, chunk_bytes=(a.chunk_kb << 10) or None,
                                      timeout=a.timeout)
        answer({"ready": True})

    def chaos(self, name: str) -> dict[str, Any]:
        """One Chaos round under the named policy (its tree and wire format; equal weights:
        ``--samples`` per node)."""
        assert self.reducer is not None and self.links is not None
        policy = self.policies[name]
        factor = self._next()
        np.multiply(self.grad, np.float32(factor), out=self.send)  # untimed
        sent0, tx0 = self.links.traffic()[0], tx_bytes()
        c0, start = time.process_time(), time.perf_counter()
        res = self.reducer.allreduce(self.send, self.args.samples, step=self.round,
                                     policy=policy, out=self.out)
        end, cpu = time.perf_counter(), time.process_time() - c0
        sent, tx = self.links.traffic()[0] - sent0, tx_bytes() - tx0
        return self._result(np.asarray(res.values), factor, start, end, cpu, sent, tx)

    def gloo(self) -> dict[str, Any]:
        """One gloo round: SUM of the input divided by the world size beforehand, untimed,
        as DDP divides each bucket before its all-reduce."""
        assert self.pg is not None
        factor = self._next()
        torch.mul(torch.from_numpy(self.grad), factor / self.world, out=self.work)  # untimed
        tx0 = tx_bytes()
        c0, start = time.process_time(), time.perf_counter()
        self.pg.allreduce([self.work]).wait()  # type: ignore[attr-defined]  # dist.all_reduce
        end, cpu = time.perf_counter(), time.process_time() - c0
        return self._result(self.work.numpy(), factor, start, end, cpu, None, tx_bytes() - tx0)

    def gloo_rooted(self) -> dict[str, Any]:
        """One gloo round rooted at rank 0 (on the mesh, the fast hub): ``reduce`` SUM of the
        pre-divided input to rank 0, then ``broadcast`` from it, as a user who knows the
        topology would pick over gloo's ring."""
        assert self.pg is not None
        factor = self._next()
        torch.mul(torch.from_numpy(self.grad), factor / self.world, out=self.work)  # untimed
        tx0 = tx_bytes()
        c0, start = time.process_time(), time.perf_counter()
        self.pg.reduce(self.work, 0).wait()  # type: ignore[attr-defined]  # dist.reduce
        self.pg.broadcast(self.work, 0).wait()  # type: ignore[attr-defined]  # dist.broadcast
        end, cpu = time.perf_counter(), time.process_time() - c0
        return self._result(self.work.numpy(), factor, start, end, cpu, None, tx_bytes() - tx0)

    def _next(self) -> float:
        self.round += 1
        return scale(self.round)

    def _result(self, values: np.ndarray, factor: float, start: float, end: float, cpu: float,
                sent: int | None, tx: int) -> dict[str, Any]:
        """The answer for one round, its result checked against the exact average."""
        return {"start": start, "end": end, "cpu": cpu,
                "checksum": float(values.sum(dtype=np.float64)),
                "err": self._maxdiff(values, factor), "sent": sent, "tx": tx}

    def _maxdiff(self, values: np.ndarray, factor: float) -> float:
        """max |values - factor * exact average|, in place: no 100 MB temporaries."""
        np.multiply(self.expect, np.float32(factor), out=self.scratch)
        np.subtract(values, self.scratch, out=self.scratch)
        return float(np.max(np.abs(self.scratch, out=self.scratch)))

    def close(self) -> None:
        if self.reducer is not None:
            self.reducer.close()
        if self.links is not None:
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
    ap.add_argument("--gloo-only", action="store_true",
                    help="no Chaos links in this process: gloo alone")
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
            elif cmd == "gloo-rooted":
                answer(w.gloo_rooted())
            elif cmd == "quit":
                return 0
            else:
                raise SystemExit(f"unknown request {cmd!r}")
    finally:
        w.close()


if __name__ == "__main__":
    sys.exit(main())
