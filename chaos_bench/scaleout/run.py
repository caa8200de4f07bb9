"""``chaosctl bench scaleout``: the paper's Figs. 7 and 10 on the network-namespace testbed.

For each cluster size N and repeat, a fresh testbed of N+1 nodes (random topology: node i links
to ``degree`` random earlier nodes, each link shaped with tbf at a rate drawn from ``bw``; the
seed changes per size and repeat). ``n{N+1}`` is the new node and its testbed neighbours are its
replication neighbours. iperf3 measures its links (neighbour to new node, inside the
namespaces) before any transfer, one at a time and then all at once
(:mod:`chaos_bench.scaleout.links`). Then for each model every other node runs a state
server (:mod:`chaos_bench.scaleout.node`) on one shared snapshot, and the new node runs the
strategies one after the other (order rotated per repeat) on that same instance: ``chaos``
(planned by its default planner, water-filling, from the rates measured all at once, as a
joining trainer measures them; rebalanced at run time), ``chaos-paper`` (the same strategy with
the paper's Algorithms 1+2, the ``paper`` planner), ``single``, ``multi-source`` (an even split
over all N nodes, relayed hop by hop along shortest-hop testbed paths), ``stop-resume``, and
``plain``: plain sockets with the water-filling split, no protocol, no verification on the
clock (:mod:`chaos_bench.scaleout.plain`).

With ``star`` (``chaosctl bench scaleout --star 200,400,800``, the issue's testbed), there is
one testbed per repeat instead: the new node ``n1`` at the centre of a star, one neighbour per
given rate, each link shaped with tbf to it.

The bounds: water-filling over the rates measured one at a time (``lb_measured``: each link
alone), over the rates measured all at once (``lb_achievable``: what the links deliver together
on this box, the bound the goal is stated against), and over the configured tbf rates.

Stop-resume writes, fsyncs, evicts and reads back ``checkpoints`` real checkpoints on this
box's disk and takes the slowest (every node holds the same state and, as modelled, a disk of
its own), plus a real ``python -c 'import torch'`` restart.

Cluster idle time (Fig. 10: "the total idle time of affected nodes during scale-out"), in
node-seconds over the N existing nodes (the new node is not counted):

- measured, ``busy_node_s``: each server's busy window, from the first replication request it
  got to the last byte it sent or relayed (sampled every 10 ms in the server), summed;
- ``idle_s`` as reported: ``chaos``, ``chaos-paper`` and ``multi-source``: ``busy_node_s`` (a
  node that serves or relays is counted idle for its window, as the paper does, although ours
  serve a snapshot while they could keep computing); ``single`` (EDL+): N x delay, modelled
  (EDL+'s barrier makes every node wait); ``stop-resume`` (Pollux): N x delay, modelled (every
  node stops).
"""

from __future__ import annotations

import functools
import itertools
import json
import sys
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos_bench.models import make_state, model_entries
from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_bench.scaleout import report
from chaos_bench.scaleout.links import measure_concurrent, measure_links
from chaos_bench.workers import LineWorker
from chaos_edge.replication.manifest import Manifest
from chaosctl.client import CtlError, CtlUsageError
from chaosctl.testbed.core import Testbed
from netprobe import iperf, netns

STRATEGIES = report.STRATEGIES
MIB = 1 << 20
PORT = 7600
PLAIN_PORT = PORT + 1
ANSWER_S = 600.0
NODE_MODULE = "chaos_bench.scaleout.node"


def routes_from(links: Sequence[tuple[str, str]], new: str) -> dict[str, list[str]]:
    """Shortest-hop path from ``new`` to every node (first hop a neighbour, last the node)."""
    adj: dict[str, list[str]] = {}
    for a, b in links:
        adj.setdefault(a, []).append(b)
        adj.setdefault(b, []).append(a)
    prev, queue = {new: ""}, deque([new])
    while queue:
        u = queue.popleft()
        for v in sorted(adj.get(u, []), key=lambda x: int(x[1:])):
            if v not in prev:
                prev[v] = u
                queue.append(v)
    out = {}
    for node in prev:
        path, u = [], node
        while u != new:
            path.append(u)
            u = prev[u]
        if path:
            out[node] = path[::-1]
    return out


def _node(tb: Testbed, node: str, argv: list[str], log: Path) -> LineWorker:
    """A :mod:`chaos_bench.scaleout.node` process in ``node``'s namespace."""
    return LineWorker(node, NODE_MODULE, argv, log, popen=functools.partial(tb.exec, node))


def run_model(tb: Testbed, new: str, model: str, state: Path, inst: dict[str, Any],
              order: list[str], checkpoints: int, stop_runs: int = 1) -> dict[str, Any]:
    """Servers on every existing node, the strategies on the new node; one result each.
    ``stop-resume`` runs ``stop_runs`` times on the instance and keeps its median run (its
    restart, a fresh process that imports torch, varied 5x between runs on a loaded box);
    ``samples_s`` has every run's delay."""
    nodes = [n for n in tb.nodes if n != new]
    nbrs = inst["neighbours"]
    addrs = {n: [tb.addr_of(n), PORT] for n in tb.nodes}
    manifest = str(state.with_suffix(".manifest.json"))
    common = ["--state", str(state), "--manifest", manifest]
    logdir = tb.dir / "logs"
    logdir.mkdir(exist_ok=True)
    kids: list[LineWorker] = []
    try:
        servers = {}
        for n in nodes:
            peers = json.dumps({p: addrs[p] for p in tb.neighbours(n)})
            servers[n] = _node(tb, n, ["serve", "--node", n, *common, "--port", str(PORT),
                                       "--plain-port", str(PLAIN_PORT), "--peers", peers],
                               logdir / f"{n}-{model}.log")
            kids.append(servers[n])
        for child in servers.values():
            child.recv(60)
        cfg = inst["configured_mbps"]
        # Planned from the links measured all at once, as a joining trainer measures them.
        job = {
            "neighbors": [[n, 0.0, 8 / (inst["concurrent_mbps"][n] * 1e6)] for n in nbrs],
            "sources": [[n, 0.0, 8 / (min(cfg[_key(p, q)] for p, q in _hops(new, r)) * 1e6)]
                        for n, r in inst["routes"].items()],
            "routes": inst["routes"],
            "addresses": {n: addrs[n] for n in nodes},
            "plain_addresses": {n: [tb.addr_of(n), PLAIN_PORT] for n in nbrs},
            "checkpoint_nodes": nbrs[:checkpoints],
            "planner": "chaos",
        }
        job_file = tb.dir / f"job-{model}.json"
        job_file.write_text(json.dumps(job))
        ckpt = tb.dir / "ckpt"
        ckpt.mkdir(exist_ok=True)
        joiner = _node(tb, new, ["join", "--node", new, *common, "--job", str(job_file),
                                 "--workdir", str(ckpt)], logdir / f"{new}-{model}.log")
        kids.append(joiner)
        joiner.recv(60)
        out = {}
        for name in order:
            runs = []
            for _ in range(stop_runs if name == "stop-resume" else 1):
                for child in servers.values():
                    child.ask("mark", 30)
                res = joiner.ask(f"run {name}", ANSWER_S)
                if "error" in res:
                    raise CtlError(f"{name} failed on {len(nodes)}->{len(nodes) + 1}, "
                                   f"{model}: {res['error']}")
                res["servers"] = {n: child.ask("report", 30) for n, child in servers.items()}
                runs.append(res)
            runs.sort(key=lambda r: float(r["delay_s"]))
            out[name] = runs[(len(runs) - 1) // 2]
            if len(runs) > 1:
                out[name]["samples_s"] = [r["delay_s"] for r in runs]
        return out
    finally:
        for child in kids:
            child.close(grace_s=3.0)


def _key(a: str, b: str) -> str:
    return "-".join(sorted((a, b), key=lambda x: int(x[1:])))


def _hops(new: str, route: list[str]) -> list[tuple[str, str]]:
    path = [new, *route]
    return list(itertools.pairwise(path))


def run_instance(size: int, rep: int, models: list[str], states: dict[str, Path],
                 opts: dict[str, Any], base: Path, say: Say) -> dict[str, Any]:
    """One testbed of size+1 nodes: measure the new node's links, then every model on it.

    With ``opts["star"]`` (Mbit/s per neighbour), the testbed is a star instead: the new node
    ``n1`` at its centre, one neighbour per rate, each link shaped to its rate.
    """
    seed = opts["seed"] * 1000 + size * 10 + rep
    tag = f"{size}->{size + 1} repeat {rep + 1}"
    star: list[float] = opts.get("star") or []
    kind = "star" if star else "random"
    with Testbed(base / f"tb-{size}-{rep}", size + 1, kind, opts["bw"], seed,
                 degree=opts["degree"], run_id=opts["run_id"]) as tb:
        say(f"{tag}: building the testbed ({size + 1} namespaces, {kind}, seed {seed})")
        tb.up(start_daemons=False)
        new = "n1" if star else f"n{size + 1}"
        nbrs = tb.neighbours(new)
        for nb, mbit in zip(nbrs, star, strict=False):
            tb.shape(new, nb, mbit)
        cfg = {_key(i.a, i.b): float(i.mbit or 0.0) for i in tb.link_info()}
        say(f"{tag}: iperf3 on the new node's links to {', '.join(nbrs)}, one at a time "
            "and all at once")
        meas = measure_links(tb, new, nbrs, opts["iperf_s"])
        conc = measure_concurrent(tb, new, nbrs, opts["iperf_s"])
        inst: dict[str, Any] = {
            "size": size, "repeat": rep, "seed": seed, "new": new, "neighbours": nbrs,
            "links": [list(ln) for ln in tb.links], "configured_mbps": cfg,
            "measured_mbps": meas, "concurrent_mbps": conc,
            "routes": routes_from(tb.links, new), "models": {},
        }
        say(f"{tag}: measured " + ", ".join(
            f"{n} {meas[n]:.0f}/{conc[n]:.0f}/{cfg[_key(n, new)]:.0f}" for n in nbrs)
            + " Mbit/s (alone/all at once/configured)")
        k = rep % len(report.RUNS)
        order = list(report.RUNS[k:] + report.RUNS[:k])
        for model in models:
            t0 = time.perf_counter()
            res = run_model(tb, new, model, states[model], inst, order, opts["checkpoints"],
                            opts.get("stop_runs", 1))
            inst["models"][model] = res
            say(f"{tag}: {model}: " + ", ".join(
                f"{s} {res[s]['delay_s']:.2f}s" for s in report.RUNS)
                + f" ({time.perf_counter() - t0:.0f}s)")
    return inst


def run(sizes: list[int], models: list[str], repeats: int, bw: tuple[float, float], out: Path,
        say: Say, *, degree: int = 3, iperf_s: float = 2.0, checkpoints: int = 1,
        seed: int = 1, workdir: Path | None = None, run_id: str | None = None,
        star: Sequence[float] = (), stop_runs: int = 1) -> dict[str, Any]:
    """Run the whole bench, write JSON/markdown/PNG under ``out``; returns the JSON document.

    ``star`` (Mbit/s per neighbour) replaces the random testbeds with one star: the new node
    at the centre, ``len(star)`` neighbours, each link at its rate (``sizes``, ``bw`` and
    ``degree`` are then unused). ``stop_runs``: stop-resume runs per instance (the median
    one is kept).

    Raises:
        CtlError: Not root (or no ``ip netns``), no iperf3, or a strategy failed.
    """
    reason = netns.netns_unavailable_reason()
    if reason is not None:
        raise CtlError(f"bench scaleout needs network namespaces: {reason}")
    if iperf.find_iperf3() is None:
        raise CtlError("bench scaleout needs iperf3 (apt-get install iperf3)")
    for m in models:
        try:
            model_entries(m)  # unknown names fail before anything is built
        except ValueError as exc:
            raise CtlUsageError(str(exc)) from None
    if star:
        sizes, degree = [len(star)], len(star)
        bw = (min(star), max(star))
    opts = {"bw": bw, "degree": degree, "iperf_s": iperf_s, "checkpoints": checkpoints,
            "seed": seed, "run_id": run_id, "star": list(star), "stop_runs": stop_runs}
    t_start = time.perf_counter()
    instances = []
    with tempfile.TemporaryDirectory(prefix="chaos-scaleout-", dir=workdir) as tmp:
        base = Path(tmp)
        states: dict[str, Path] = {}
        manifests: dict[str, Manifest] = {}
        for i, m in enumerate(models):
            states[m] = base / f"{m}.state"
            manifests[m] = make_state(m, states[m], seed * 100 + i)
            say(f"state {m}: {manifests[m].total_bytes / MIB:.1f} MiB, "
                f"{len(manifests[m].entries)} tensors")
        for size in sizes:
            for rep in range(repeats):
                instances.append(run_instance(size, rep, models, states, opts, base, say))
    meta = {"sizes": sizes, "models": models, "repeats": repeats, "bw_mbps": list(bw),
            "star_mbps": list(star),
            "degree": degree, "iperf_s": iperf_s, "checkpoints": checkpoints, "seed": seed,
            "stop_runs": stop_runs,
            "argv": sys.argv, "wall_s": time.perf_counter() - t_start,
            "mib": {m: manifests[m].total_bytes / MIB for m in models},
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "idle_definition": report.IDLE_DEFINITION}
    doc = {"meta": meta, "rows": report.summarise(instances, manifests), "instances": instances}
    report.write(Output(out, say), doc)
    return doc
