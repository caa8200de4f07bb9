"""Scale-out delay of the four strategies side by side on one loopback cluster.

``chaosctl bench loopback [--quick] [--repeats N] [--models M,...] [--bw-scale X] [--out DIR]``

Setup: ``--nodes`` state-server processes (``n0``..), each serving the same snapshot (a file
mapped read-only, so the page cache holds one copy for all of them). The new node's neighbours are
``n0``..``n{K-1}``; the overlay also has a ring over all nodes, and multi-source reaches the other
nodes along shortest-hop paths through the neighbours (relayed hop by hop). Every link gets a
bandwidth cap drawn uniformly from 100-1000 Mbit/s times ``--bw-scale`` (the paper's tc range),
enforced by a token bucket in each sender and shared by all connections over that link, so the
network, not the CPU, is the bottleneck. States have the sizes of the paper's models (tensor
shapes from the packaged ``paper_models.json``, synthetic bytes; see
:mod:`chaos_bench.models`); ``--quick`` uses ResNet101 and AlexNet.

Reported per model (medians over ``--repeats``): each strategy's delay; the water-filling lower
bound from the configured caps and from the per-link throughput measured in the chaos run; chaos
over each bound; each baseline over chaos; the planner's decision time; and the largest extra
anonymous memory a neighbour process used while serving. Writes ``scaleout_bench.json`` and
``scaleout_bench.png`` to DIR and prints a markdown table.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import random
import statistics
import sys
import tempfile
import threading
import time
from collections import deque
from dataclasses import asdict, dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

from chaos_bench.models import make_state, map_state
from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_edge.dataplane import auth
from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.planning.model import Neighbor, PlanInput
from chaos_edge.replication.planning.waterfill import lower_bound
from chaos_edge.replication.transfer import (
    STRATEGIES,
    FetchOptions,
    ScaleOutJob,
    Snapshot,
    run_strategy,
    serve,
)

QUICK = ["resnet101", "alexnet"]
FULL = ["resnet101", "alexnet", "vgg11", "gpt2", "gpt2-medium", "gpt2-large"]
SECRET = b"scaleout-bench"
MIB = 1 << 20


@dataclass(frozen=True)
class Options:
    """What one run measures; the CLI checks the values."""

    repeats: int
    nodes: int = 6  # cluster nodes before the join
    neighbors: int = 3  # the new node's neighbours
    bw_scale: float = 1.0  # times the 100-1000 Mbit/s caps
    planner: str = "chaos"  # planner of the chaos strategy (``paper``: Algorithms 1+2)
    seed: int = 1


def ident(node: str) -> auth.Identity:
    """Bench credentials of ``node``."""
    return auth.Identity(node, "bench", SECRET, auth.new_incarnation())


def rss_anon() -> int:
    """Anonymous resident memory of this process in bytes (file-backed snapshot pages excluded)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1]) * 1024
    return 0


def _node_main(
    node: str, path: str, manifest_json: str, caps: dict[str, float], conn: Connection
) -> None:
    """A cluster node: serve the mapped snapshot; sample memory; obey the bench's commands."""
    manifest = Manifest.from_json(manifest_json)
    data = map_state(path)
    server = serve(Snapshot.create(manifest, data), ident(node), rate=caps.get)
    conn.send(server.address)
    peak, base, stop = [0], [rss_anon()], threading.Event()

    def sample() -> None:
        while not stop.wait(0.005):
            peak[0] = max(peak[0], rss_anon() - base[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    while True:
        cmd, arg = conn.recv()
        if cmd == "peers":
            server.peers.update(arg)
        elif cmd == "mem_reset":
            base[0], peak[0] = rss_anon(), 0
        elif cmd == "stop":
            break
        conn.send(peak[0] if cmd == "mem" else "ok")
    stop.set()
    server.close()
    conn.send("ok")


def topology(n: int, k: int, scale: float, rng: random.Random
             ) -> tuple[dict[frozenset[str], float], dict[str, list[str]]]:
    """Link caps (bytes/s, keyed by node pair) and shortest-hop routes from ``new``."""
    edges = [("new", f"n{i}") for i in range(k)] + [(f"n{i}", f"n{(i + 1) % n}") for i in range(n)]
    caps = {frozenset(e): rng.uniform(100, 1000) * scale * 1e6 / 8 for e in edges}
    adj: dict[str, list[str]] = {}
    for a, b in edges:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    prev: dict[str, str] = {"new": ""}
    queue = deque(["new"])
    while queue:  # breadth first: fewest hops
        u = queue.popleft()
        for v in sorted(adj[u]):
            if v not in prev:
                prev[v] = u
                queue.append(v)
    routes = {}
    for node in (f"n{i}" for i in range(n)):
        path, u = [], node
        while u != "new":
            path.append(u)
            u = prev[u]
        routes[node] = path[::-1]
    return caps, routes


def run_model(name: str, args: Options, tmp: Path, rng: random.Random) -> dict[str, Any]:
    """Every strategy on one model, ``args.repeats`` times; returns the row."""
    path = tmp / f"{name}.state"
    manifest = make_state(name, path, rng.randrange(1 << 30))
    caps, routes = topology(args.nodes, args.neighbors, args.bw_scale, rng)
    ctx = mp.get_context("spawn")
    nodes = [f"n{i}" for i in range(args.nodes)]
    procs: list[Any] = []
    pipes: dict[str, Connection] = {}
    addrs: dict[str, Any] = {}
    try:
        for node in nodes:
            mine = {next(iter(e - {node})): c for e, c in caps.items() if node in e}
            parent, child = ctx.Pipe()
            p = ctx.Process(
                target=_node_main,
                args=(node, str(path), manifest.to_json(), mine, child),
                daemon=True,
            )
            p.start()
            procs.append(p)
            pipes[node] = parent
            addrs[node] = parent.recv()
        for node in nodes:
            pipes[node].send(("peers", addrs))
            pipes[node].recv()
        k_nodes = nodes[: args.neighbors]
        est = {n: Neighbor(n, 0.0, 1.0 / caps[frozenset(("new", n))]) for n in k_nodes}
        sources = [est.get(n) or Neighbor(n, 0.0, 8 / (550e6 * args.bw_scale)) for n in nodes]
        data = map_state(path)
        try:
            job = ScaleOutJob(
                manifest,
                ident("new"),
                tuple(est.values()),
                addrs,
                tuple(sources),
                routes,
                {n: data for n in nodes},
                tmp,
                args.planner,
                FetchOptions(io_timeout=30.0),
            )
            runs = [one_repeat(job, pipes, r) for r in range(args.repeats)]
            del job
        finally:
            data.release()
    finally:
        for pipe in pipes.values():
            with contextlib.suppress(OSError):
                pipe.send(("stop", None))
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
        path.unlink(missing_ok=True)
        path.with_suffix(".manifest.json").unlink(missing_ok=True)
    lb_cfg = lower_bound(PlanInput.create(est.values(), manifest.segments()))
    return summarise(name, manifest.total_bytes, lb_cfg, runs)


def one_repeat(job: ScaleOutJob, pipes: dict[str, Connection], r: int) -> dict[str, Any]:
    """Run every strategy once (order rotated per repeat); delays and chaos' link rates."""
    names = list(STRATEGIES)
    names = names[r % len(names) :] + names[: r % len(names)]
    out: dict[str, Any] = {}
    for name in names:
        for p in pipes.values():
            p.send(("mem_reset", None))
            p.recv()
        res = run_strategy(name, job)
        mem = []
        for p in pipes.values():
            p.send(("mem", None))
            mem.append(p.recv())
        out[name] = {
            "delay_s": res.delay_s,
            "decision_s": res.decision_s,
            "phases": res.phases,
            "neighbor_extra_mem": max(mem),
        }
        if name == "chaos" and res.fetch is not None:
            rates = {}
            for s, t in res.fetch.sources.items():
                if t.bytes and t.start_s is not None and t.end_s is not None:
                    rates[s] = t.bytes / max(t.end_s - t.start_s, 1e-9)
                    out[name].setdefault("sources", {})[s] = [t.start_s, t.end_s, t.bytes]
            out["measured_rates"] = rates
        del res
    return out


def summarise(name: str, total: int, lb_cfg: float, runs: list[dict[str, Any]]
              ) -> dict[str, Any]:
    """Medians and ratios over the repeats."""
    med = {s: statistics.median(r[s]["delay_s"] for r in runs) for s in STRATEGIES}
    lb_meas = statistics.median(
        total / sum(r["measured_rates"].values()) if r["measured_rates"] else float("nan")
        for r in runs
    )
    wins = all(
        r["chaos"]["delay_s"] < r[s]["delay_s"] for r in runs for s in STRATEGIES if s != "chaos"
    )
    return {
        "model": name,
        "mib": total / MIB,
        "delay_s": med,
        "lb_cfg_s": lb_cfg,
        "lb_measured_s": lb_meas,
        "chaos_over_lb_cfg": med["chaos"] / lb_cfg,
        "chaos_over_lb_measured": med["chaos"] / lb_meas,
        "baseline_over_chaos": {s: med[s] / med["chaos"] for s in STRATEGIES if s != "chaos"},
        "decision_ms": statistics.median(r["chaos"]["decision_s"] for r in runs) * 1e3,
        "neighbor_extra_mib": max(r["chaos"]["neighbor_extra_mem"] for r in runs) / MIB,
        "relay_extra_mib": max(r["multi-source"]["neighbor_extra_mem"] for r in runs) / MIB,
        "chaos_fastest_every_repeat": wins,
        "runs": runs,
    }


def table(rows: list[dict[str, Any]]) -> str:
    """The markdown table."""
    head = (
        "| model | MiB | chaos s | single s | multi-src s | stop-resume s | LB cfg s | "
        "LB meas s | chaos/LB cfg | chaos/LB meas | single/chaos | multi/chaos | "
        "stop/chaos | plan ms | nbr mem MiB | chaos best |"
    )
    lines = [head, "|" + " --- |" * 16]
    for r in rows:
        d, b = r["delay_s"], r["baseline_over_chaos"]
        lines.append(
            f"| {r['model']} | {r['mib']:.0f} | {d['chaos']:.2f} | {d['single']:.2f} | "
            f"{d['multi-source']:.2f} | {d['stop-resume']:.2f} | {r['lb_cfg_s']:.2f} | "
            f"{r['lb_measured_s']:.2f} | {r['chaos_over_lb_cfg']:.3f} | "
            f"{r['chaos_over_lb_measured']:.3f} | {b['single']:.2f} | {b['multi-source']:.2f} | "
            f"{b['stop-resume']:.2f} | {r['decision_ms']:.1f} | {r['neighbor_extra_mib']:.1f} | "
            f"{'yes' if r['chaos_fastest_every_repeat'] else 'no'} |"
        )
    return "\n".join(lines)


def draw(plt: Any, rows: list[dict[str, Any]]) -> Any:
    """Grouped bars of the four delays per model, with the lower bound marked."""
    fig, ax = plt.subplots(figsize=(9, 4.5))
    names = list(STRATEGIES)
    width = 0.8 / len(names)
    for i, s in enumerate(names):
        xs = [j + i * width for j in range(len(rows))]
        ax.bar(xs, [r["delay_s"][s] for r in rows], width, label=s)
    ax.scatter(  # the bound sits over the chaos bar, the one it is meant for
        list(range(len(rows))),
        [r["lb_cfg_s"] for r in rows],
        marker="_",
        s=400,
        color="k",
        label="lower bound (caps)",
        zorder=3,
    )
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))], [r["model"] for r in rows])
    ax.set_ylabel("scale-out delay (s)")
    ax.set_yscale("log")
    ax.legend(fontsize=8)
    ax.set_title("Scale-out delay on loopback with capped links (median of repeats)")
    return fig


def run(models: list[str], opts: Options, out: Path,
        say: Say) -> dict[str, Any]:
    """Every model in turn; writes ``scaleout_bench.json`` (and the PNG) under ``out``."""
    output = Output(out, say)
    rng = random.Random(opts.seed)
    rows = []
    with tempfile.TemporaryDirectory(dir=output.folder()) as tmp:
        for name in models:
            say(f"{name}: {opts.nodes} nodes, {opts.repeats} repeats of 4 strategies")
            t0 = time.perf_counter()
            rows.append(run_model(name, opts, Path(tmp), rng))
            say(f"{name}: done in {time.perf_counter() - t0:.0f} s")
    meta = {**asdict(opts), "caps_mbps": [100 * opts.bw_scale, 1000 * opts.bw_scale],
            "argv": sys.argv}
    doc = {"meta": meta, "rows": rows}
    output.json("scaleout_bench.json", doc)
    output.figure("scaleout_bench.png", lambda plt: draw(plt, rows), dpi=120)
    return doc


def caption(opts: Options) -> str:
    """The line above the table."""
    return (f"caps {100 * opts.bw_scale:.0f}-{1000 * opts.bw_scale:.0f} Mbit/s per link, "
            f"{opts.nodes} nodes, {opts.neighbors} neighbours, {opts.repeats} repeats, medians; "
            f"chaos plans with {opts.planner!r}")
