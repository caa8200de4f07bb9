"""Chaos's all-reduce against torch.distributed's gloo, in the same processes and on the same
tensor, on loopback (here) and on a shaped netns mesh (:mod:`chaos_bench.allreduce.mesh`).

``chaosctl bench allreduce [--network loopback,mesh] [--mb 100] [--nodes 4] [--repeats 5]
[--chunk-kb 1024,16384] [--tree centre,star] [--wire fp32] [--result reuse] [--samples 1]
[--mesh-mb 20] [--mesh-chunk-kb 1024] [--mesh-shape star,uniform] [--fast-mbit 1000]
[--slow-mbit 100] [--out DIR]``

``--nodes`` worker processes (:mod:`chaos_bench.allreduce.worker`) each hold one random
``--mb`` MB float32 gradient. Every repeat runs one gloo round, one round of gloo alone and one
Chaos round (``AllReducer``) per tree of ``--tree`` (``chain``: rooted at an end; ``centre``:
the same chain rooted at its centre; ``star``: what ``spanning_tree`` builds over equal links),
in an order that rotates every repeat; one warm-up of each is dropped.

The baseline is gloo doing what a DDP user's gloo does: ``allreduce`` SUM of a gradient divided
by the world size beforehand (untimed; gloo has no AVG), while Chaos's average is timed inside
its pipeline. ``gloo`` runs in Chaos's own processes on the same tensor; ``gloo-alone`` runs in
a second set of processes that hold no Chaos links at all, started beside the first and timed
in the same rotation. The ratio is Chaos's throughput over the faster of the two (by median:
the JSON's ``baseline``, with the ratio against each in ``ratios_by_baseline``); ``min`` rows
compare the fastest rounds.

Every round's input is new (the gradient times a factor that changes every round, applied
untimed), and every process checks every result, of every kind, element by element against
the exact average of the inputs: within float32 rounding (:data:`TOLERANCE`) for fp32, or the
bench stops; the largest error is reported for every row. Chaos's members must also hold
bit-identical results. A round's time runs from the first process's start to the last one's
finish; throughput is gradient bytes per second. CPU seconds (every thread of every process,
``time.process_time``) per GB of gradient show where a small box's cores go: the processes
share them, so CPU bounds the wall time.

``--wire`` runs every Chaos tree in each gradient wire format (``fp32``, ``fp16``, ``bf16``,
``int8``; the policy's ``wire``), named ``chaos/TREE+FORMAT`` (plain ``chaos/TREE`` is fp32).
Every row shows the megabytes each node's links sent per round (frame headers included;
measured by ``PeerLinks.traffic``) and, on the mesh, what each namespace's interfaces sent
(``/proc/net/dev``, TCP/IP headers and gloo included); a compressed row's error is the format's.

``--chunk-kb 0`` (and ``--mesh-chunk-kb 0``) sizes the chunks by the vector, as the Trainer
does by default (``AllReducer(chunk_bytes=None)``: about 12 chunks of 1 to 16 MiB).

``--mesh-shape`` picks the mesh's link rates: ``star`` (the fast hub, as above) or ``uniform``
(every link at ``--slow-mbit``), or both. On the mesh gloo also runs rooted at the hub
(``gloo-rooted``: ``reduce`` to ``n1``, then ``broadcast``), and every row shows its link
bound (:func:`chaos_bench.allreduce.mesh.link_bounds`): the least time its algorithm could take
on those links.

``--result fresh`` lets every Chaos round return a new buffer (the kernel zeroes its pages);
``reuse`` passes the same ``out=`` every round, as the Trainer does. ``--samples`` above 1
weights every node alike (the same average, through the weighting path).

Prints a rich table and writes ``DIR/allreduce_bench.json`` with every run, to show the noise.
"""

from __future__ import annotations

import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from rich.table import Table

from chaos_bench.allreduce import mesh as allreduce_mesh
from chaos_bench.allreduce.procs import (
    GOALS,
    TOLERANCE,
    chunk_label,
    close_all,
    compare,
    run_rounds,
    start_worker,
    wire_of,
    with_wires,
    worker_argv,
)
from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_bench.workers import LineWorker
from daemon.contracts.policy import SyncPolicy

__all__ = ["GOALS", "TOLERANCE", "TREES", "bench_loopback", "run", "table", "tree", "wire_of"]

TREES = ("chain", "centre", "star")


def tree(kind: str, ids: list[str]) -> SyncPolicy:
    """``chain``: a chain rooted at one end; ``centre``: the same chain rooted at its centre
    (what spanning_tree picks); ``star``: a star around the first id."""
    if kind == "star":
        return SyncPolicy.build(1, ids, [(ids[0], n) for n in ids[1:]], ids[0])
    edges = [(ids[k], ids[k + 1]) for k in range(len(ids) - 1)]
    return SyncPolicy.build(1, ids, edges, ids[(len(ids) - 1) // 2 if kind == "centre" else 0])


def bench_loopback(opts: dict[str, Any], chunk_kb: int, reuse: bool, logdir: Path
                   ) -> dict[str, Any]:
    """Chaos (over each tree of ``opts["trees"]``) and gloo on ``opts["nodes"]`` loopback
    processes; one :func:`compare` result."""
    nodes, mb = opts["nodes"], opts["mb"]
    nbytes = mb * 1_000_000 // 4 * 4
    ids = [f"n{k}" for k in range(nodes)]
    procs: list[LineWorker] = []
    alone: list[LineWorker] = []
    try:
        for rank, node in enumerate(ids):
            argv = worker_argv(node, rank, nodes, "127.0.0.1", nbytes, opts, chunk_kb, reuse)
            procs.append(start_worker(node, argv, logdir / f"loopback-{node}.log"))
        for rank, node in enumerate(ids):
            argv = worker_argv(node, rank, nodes, "127.0.0.1", nbytes, opts, chunk_kb, reuse,
                               gloo_only=True)
            alone.append(start_worker(node, argv, logdir / f"loopback-alone-{node}.log"))
        policies = with_wires({t: tree(t, ids) for t in opts["trees"]},
                              opts.get("wires", ["fp32"]))
        runs = run_rounds(procs, policies, opts["repeats"], alone)
    finally:
        close_all(procs + alone)
    case = (f"loopback x{nodes}, {mb} MB, {chunk_label(chunk_kb)} chunks, "
            f"{'reuse' if reuse else 'fresh'}")
    return compare("loopback", case, runs, nbytes,
                   {"chunk_kb": chunk_kb, "reuse": reuse, "nodes": nodes})


def run(opts: dict[str, Any], out: Path, say: Say) -> dict[str, Any]:
    """Every requested network and case; writes and returns the JSON document.

    ``opts``: networks, mb, nodes, repeats, chunk_kbs, results, trees, wires (default
    fp32 only), samples, sock_buf, and for the mesh mesh_mb, mesh_chunk_kb, fast_mbit,
    slow_mbit.
    """
    output = Output(out, say)
    logdir = output.folder() / "logs"
    logdir.mkdir(exist_ok=True)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    results = []
    if "loopback" in opts["networks"]:
        for chunk_kb in opts["chunk_kbs"]:
            for mode in opts["results"]:
                say(f"loopback: {opts['nodes']} processes, {opts['mb']} MB, trees "
                    f"{','.join(opts['trees'])}, wire {','.join(opts.get('wires', ['fp32']))}, "
                    f"{chunk_label(chunk_kb)} chunks, {mode} out, {opts['repeats']} repeats")
                results.append(bench_loopback(opts, chunk_kb, mode == "reuse", logdir))
    if "mesh" in opts["networks"]:
        for shape in opts.get("mesh_shapes", ["star"]):
            results.append(allreduce_mesh.run(opts, opts["mesh_chunk_kb"],
                                              "reuse" in opts["results"], logdir, say, shape))
    doc = {"options": opts, "cpus": os.cpu_count(), "machine": platform.platform(),
           "argv": sys.argv, "loadavg_before_after": [load_before, os.getloadavg()],
           "wall_s": time.perf_counter() - t0, "goals": GOALS, "results": results}
    output.json("allreduce_bench.json", doc)
    return doc


def table(doc: dict[str, Any]) -> Table:
    """The rich table: a line per network, case and implementation, with ratios and goal."""
    t = Table(title="All-reduce: Chaos vs torch.distributed gloo (medians)")
    for col in ("case", "impl", "wire", "wall s", "min s", "bound s", "MB/s", "MB sent/node",
                "MB tx/node", "max |err|", "CPU s", "CPU s/GB", "vs best gloo", "min vs min",
                "goal"):
        t.add_column(col, justify="left" if col in ("case", "impl", "wire") else "right")
    for res in doc["results"]:
        for k, r in enumerate(res["rows"]):
            ratio, low = res["ratios"].get(r["kind"]), res["min_ratios"].get(r["kind"])
            sent, err = r.get("sent_MB_per_node"), r.get("max_err")
            impl = r["kind"].partition("+")[0]
            t.add_row(res["case"] if k == 0 else "",
                      f"{impl} (baseline)" if r["kind"] == res["baseline"] else impl,
                      r.get("wire", wire_of(r["kind"])), f"{r['seconds']:.3f}",
                      f"{r['min_seconds']:.3f}",
                      f"{r['bound_s']:.3f}" if r.get("bound_s") else "",
                      f"{r['throughput_MBps']:.0f}",
                      "" if sent is None else f"{sent:.1f}",
                      f"{r.get('tx_MB_per_node') or 0:.1f}",
                      "" if err is None else f"{err:.2g}",
                      f"{r['cpu_seconds']:.3f}", f"{r['cpu_s_per_GB']:.2f}",
                      "" if ratio is None else f"{ratio:.2f}x",
                      "" if low is None else f"{low:.2f}x",
                      f">= {res['goal']:.1f}x" if k == 0 and res["goal"] else "")
    return t
