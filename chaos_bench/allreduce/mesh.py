"""The all-reduce bench's second network: a shaped full mesh of network namespaces.

Four namespaces (``n1..n4``, :mod:`chaosctl.testbed`), every pair linked by its own veth, each
link shaped with tbf in both directions. The rates are heterogeneous on purpose: a fast star
(``--fast-mbit``, 1000 by default) joins ``n1`` to every other node, and the links among the
others are slow (``--slow-mbit``, 100). A ring over four nodes has only two edges at ``n1``,
so every ring, gloo's among them, crosses two slow links; a bandwidth-aware tree need not.

Chaos's tree is what the scheduler would build from the same link rates:
:func:`daemon.contracts.policy.spanning_tree` (maximum-bandwidth spanning tree rooted at its
centre) over the rates configured on the links, read back from the kernel. The bench also runs
Chaos over a ``chain`` (n1-n2-n3-n4, rooted at an end), a tree that ignores the rates, to show
what the choice of tree is worth. gloo's group binds each node's data address (the /32 on the
namespace's loopback), its TCPStore listens on ``n1``'s.

The testbed is torn down on every exit, failures and Ctrl-C included: worker processes are
stopped, then ``Testbed.down`` kills whatever is left in the namespaces and deletes them and
their veths; the result records what remained afterwards (nothing, or the bench fails).
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

from chaos_bench.allreduce.procs import (
    chunk_label,
    close_all,
    compare,
    run_rounds,
    start_worker,
    with_wires,
    worker_argv,
)
from chaos_bench.progress import Say
from chaos_bench.workers import LineWorker
from chaos_edge.dataplane.codec import codec_for
from chaosctl.client import CtlError
from chaosctl.testbed.core import Testbed
from chaosctl.testbed.topo import norm
from daemon.contracts.policy import WIRE_FORMATS, SyncPolicy, spanning_tree
from netprobe import netns

NODES = 4


SHAPES = ("star", "uniform")


def shape_links(tb: Testbed, shape: str, fast: float, slow: float) -> dict[str, float]:
    """``star``: fast links from ``n1`` to every other node, slow links among the others;
    ``uniform``: every link slow. Returns the rate of every link as the kernel now has it
    (Mbit/s, key ``a-b``)."""
    hub = tb.nodes[0]
    for a, b in tb.links:
        tb.shape(a, b, fast if shape == "star" and hub in (a, b) else slow)
    return {f"{i.a}-{i.b}": float(i.mbit or 0.0) for i in tb.link_info()}


def link_bounds(nodes: list[str], rates: dict[str, float], trees: dict[str, SyncPolicy],
                nbytes: int) -> dict[str, float]:
    """Each kind's lower bound in seconds from the link rates alone (full duplex, every pair
    its own link; no CPU, no latency):

    - ``gloo`` (and ``gloo-alone``): torch's gloo all-reduce is a ring in rank order, one
      direction; each node sends 2(N-1)/N of the vector to the next, so the slowest ring link
      bounds it.
    - ``gloo-rooted``: any reduce to ``n1`` followed by a broadcast from it. ``n1`` must
      receive a vector's worth over its links, and then every node must receive one over its
      own links (and ``n1`` send one over its).
    - ``chaos/TREE[+WIRE]``: each tree edge carries the vector once each way, in the wire
      format, so the slowest tree edge bounds it (pipelining can at best hide all but that).
    """
    bps = {tuple(sorted(k.split("-"))): mbit * 1e6 / 8 for k, mbit in rates.items()}

    def rate(a: str, b: str) -> float:
        return bps[tuple(sorted((a, b)))]

    def into(n: str) -> float:
        return sum(rate(n, m) for m in nodes if m != n)

    n, root = len(nodes), nodes[0]
    ring = min(rate(nodes[k], nodes[(k + 1) % n]) for k in range(n))
    out = {"gloo": 2 * (n - 1) / n * nbytes / ring}
    out["gloo-alone"] = out["gloo"]
    out["gloo-rooted"] = nbytes / into(root) + max(nbytes / into(m) for m in nodes)
    for name, pol in trees.items():
        for wire in WIRE_FORMATS:
            kind = f"chaos/{name}" if wire == "fp32" else f"chaos/{name}+{wire}"
            size = codec_for(wire).wire_bytes(nbytes // 4)
            out[kind] = max(size / rate(a, b) for a, b in pol.edges)
    return out


def policies(nodes: list[str], rates: dict[str, float]) -> dict[str, SyncPolicy]:
    """``spanning``: the scheduler's tree from the link rates; ``chain``: one that ignores
    them."""
    links = {norm(*key.split("-")): mbit for key, mbit in rates.items()}
    plan = spanning_tree(nodes, links)
    chain = [(nodes[k], nodes[k + 1]) for k in range(len(nodes) - 1)]
    return {"spanning": plan.policy(1),
            "chain": SyncPolicy.build(1, nodes, chain, nodes[0])}


def leftovers(prefix: str) -> list[str]:
    """Namespaces and veths of this testbed that still exist (should be none after down)."""
    return netns.list_netns(prefix) + netns.list_links(prefix)


def run(opts: dict[str, Any], chunk_kb: int, reuse: bool, logdir: Path, say: Say,
        shape: str = "star") -> dict[str, Any]:
    """Build the mesh in ``shape`` (:data:`SHAPES`), run gloo and Chaos on it, tear it down;
    one ``compare`` result, each row with its link bound (:func:`link_bounds`).

    ``opts``: mesh_mb, fast_mbit, slow_mbit, repeats, sock_buf, samples, and optionally
    wires (default fp32 only) and run_id (the testbed's name prefix).

    Raises:
        CtlError: No network namespaces here, a worker failed, or the teardown left
            something behind.
    """
    reason = netns.netns_unavailable_reason()
    if reason is not None:
        raise CtlError(f"the mesh needs network namespaces: {reason}")
    mb = opts["mesh_mb"]
    nbytes = mb * 1_000_000 // 4 * 4
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="chaos-armesh-") as tmp:
        tb = Testbed(Path(tmp) / "tb", NODES, "full", (opts["slow_mbit"],) * 2, seed=1,
                     run_id=opts.get("run_id"))
        prefix = tb.state.prefix
        procs: list[LineWorker] = []
        alone: list[LineWorker] = []  # gloo in processes of its own
        try:
            with tb:
                say(f"mesh: building {NODES} namespaces, full mesh, " + (
                    f"{opts['fast_mbit']:g} Mbit/s from n1, {opts['slow_mbit']:g} Mbit/s among "
                    "the others" if shape == "star" else
                    f"every link {opts['slow_mbit']:g} Mbit/s"))
                tb.up(start_daemons=False)
                rates = shape_links(tb, shape, opts["fast_mbit"], opts["slow_mbit"])
                nodes = list(tb.nodes)  # in rank order: gloo's ring follows it
                trees = policies(tb.nodes, rates)
                say(f"mesh: spanning tree {list(trees['spanning'].edges)} rooted at "
                    f"{trees['spanning'].root}; {mb} MB, {chunk_label(chunk_kb)} chunks, "
                    f"{opts['repeats']} repeats")
                for rank, node in enumerate(tb.nodes):
                    for gloo_only, group in ((False, procs), (True, alone)):
                        argv = worker_argv(node, rank, NODES, tb.addr_of(node), nbytes, opts,
                                           chunk_kb, reuse, gloo_only=gloo_only)
                        log = logdir / f"mesh-{'alone-' if gloo_only else ''}{node}.log"
                        group.append(start_worker(node, argv, log,
                                                  netns.exec_prefix(tb.ns_of(node))))
                runs = run_rounds(procs, with_wires(trees, opts.get("wires", ["fp32"])),
                                  opts["repeats"], alone, rooted=True)
                close_all(procs + alone)
        finally:
            close_all(procs + alone)  # no-op for those already stopped
        left = leftovers(prefix)
    if left:
        raise CtlError(f"the mesh testbed left {', '.join(left)} behind")
    case = (f"mesh x{NODES} {shape}, {mb} MB, {chunk_label(chunk_kb)} chunks, "
            f"{'reuse' if reuse else 'fresh'}")
    res = compare("mesh", case, runs, nbytes, {
        "shape": shape, "chunk_kb": chunk_kb, "reuse": reuse, "nodes": NODES,
        "link_mbit": rates,
        "trees": {k: {"edges": [list(e) for e in p.edges], "root": p.root}
                  for k, p in trees.items()},
        "leftovers_after_teardown": left, "wall_s": time.perf_counter() - t0})
    bounds = link_bounds(nodes, rates, trees, nbytes)
    for row in res["rows"]:
        row["bound_s"] = bounds[row["kind"]]
        row["over_bound"] = row["seconds"] / row["bound_s"]
    return res
