"""The parent side of the all-reduce bench: its worker processes, their rounds, the rows.

Shared by the loopback part (:mod:`chaos_bench.allreduce.run`) and the mesh part
(:mod:`chaos_bench.allreduce.mesh`); the workers are :mod:`chaos_bench.allreduce.worker`.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos_bench.workers import LineWorker
from chaosctl.client import CtlError
from daemon.contracts.policy import SyncPolicy

#: Largest |result - exact average| accepted of an fp32 round: float32 sums in another order.
TOLERANCE = 1e-4
GOALS = {"loopback": 1.0, "mesh": 1.5}


WORKER_MODULE = "chaos_bench.allreduce.worker"


def start_worker(node: str, argv: list[str], log: Path, prefix: Sequence[str] = ()
                 ) -> LineWorker:
    """One worker process (unbuffered: its answers are never held back)."""
    return LineWorker(node, WORKER_MODULE, argv, log, prefix=prefix,
                      env={**os.environ, "PYTHONUNBUFFERED": "1"})


def worker_argv(node: str, rank: int, world: int, host: str, nbytes: int,
                opts: dict[str, Any], chunk_kb: int, reuse: bool, gloo_only: bool = False
                ) -> list[str]:
    """The command line of one worker (``gloo_only``: one that holds no Chaos links)."""
    return [*(["--gloo-only"] if gloo_only else []), "--node", node, "--rank", str(rank),
            "--world", str(world), "--host", host,
            "--elems", str(nbytes // 4), "--chunk-kb", str(chunk_kb), "--sock-buf",
            str(opts["sock_buf"]), "--samples", str(opts["samples"]),
            *(["--reuse"] if reuse else [])]


def _setup(procs: list[LineWorker], policies: dict[str, SyncPolicy]) -> None:
    """Tell one group of workers its peers, ranks, store and policies; wait until ready."""
    hello = [p.recv(120) for p in procs]
    peers = {p.node: h["addr"] for p, h in zip(procs, hello, strict=True)}
    ranks = {p.node: i for i, p in enumerate(procs)}
    store = [hello[0]["addr"][0], hello[0]["store_port"]]
    setup = {"peers": peers, "ranks": ranks, "store": store,
             "policies": {k: pol.to_dict() for k, pol in policies.items()}}
    for p in procs:
        p.send(setup)
    for p in procs:
        p.recv(120)


def run_rounds(procs: list[LineWorker], policies: dict[str, SyncPolicy], repeats: int,
               alone: list[LineWorker] | None = None, rooted: bool = False,
               timeout: float = 300.0) -> dict[str, list[dict[str, Any]]]:
    """Set the workers up, then ``repeats`` + 1 rounds of gloo and of Chaos over each tree
    (and of gloo in ``alone``, processes that hold no Chaos links: ``gloo-alone``; and with
    ``rooted``, of gloo's reduce to rank 0 and broadcast: ``gloo-rooted``), in an order that
    rotates every repeat; the warm-ups are dropped. Keys: ``gloo``, ``gloo-alone``,
    ``gloo-rooted`` and ``chaos/TREE``.

    Raises:
        CtlError: A worker died, or a result was wrong (a bug, not a slow box).
    """
    _setup(procs, policies)
    if alone:
        _setup(alone, {})
    kinds = ["gloo", *(["gloo-alone"] if alone else []), *(["gloo-rooted"] if rooted else []),
             *(f"chaos/{k}" for k in policies)]
    runs: dict[str, list[dict[str, Any]]] = {k: [] for k in kinds}
    for r in range(repeats + 1):
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            group = alone if kind == "gloo-alone" and alone else procs
            for p in group:
                p.send({"gloo-alone": "gloo"}.get(kind, kind.replace("/", ":")))
            stats = [p.recv(timeout) for p in group]
            runs[kind].append(check_round(kind, stats))
    return {k: v[1:] for k, v in runs.items()}


def check_round(kind: str, stats: list[dict[str, Any]]) -> dict[str, Any]:
    """One round's record, once its results are right: every fp32 result within
    :data:`TOLERANCE` of the exact average, and Chaos's members bit-identical.

    Raises:
        CtlError: A result was wrong.
    """
    sums = {s["checksum"] for s in stats}
    if not kind.startswith("gloo") and len(sums) != 1:
        raise CtlError(f"Chaos's members hold different results: checksums {sums}")
    err = max(s["err"] for s in stats)
    if wire_of(kind) == "fp32" and err > TOLERANCE:
        raise CtlError(f"{kind}'s result differs from the exact average by {err:g}")
    sent = [s["sent"] for s in stats if s.get("sent") is not None]
    return {
        "seconds": max(s["end"] for s in stats) - min(s["start"] for s in stats),
        "cpu_seconds": sum(s["cpu"] for s in stats),
        "max_err": err,
        "sent_bytes_per_node": sum(sent) / len(sent) if sent else None,
        "tx_bytes_per_node": sum(s.get("tx") or 0 for s in stats) / len(stats),
    }


def chunk_label(chunk_kb: int) -> str:
    """``1024 KiB``, or ``auto`` for 0 (chunks sized by the vector)."""
    return f"{chunk_kb} KiB" if chunk_kb else "auto"


def with_wires(policies: dict[str, SyncPolicy], wires: Sequence[str]) -> dict[str, SyncPolicy]:
    """Each policy in each wire format: ``NAME`` for fp32, ``NAME+FORMAT`` for the others."""
    return {name if wire == "fp32" else f"{name}+{wire}": dataclasses.replace(pol, wire=wire)
            for name, pol in policies.items() for wire in wires}


def wire_of(kind: str) -> str:
    """The wire format of a row's kind (``gloo`` and plain ``chaos/TREE`` are fp32)."""
    return kind.partition("+")[2] or "fp32"


def close_all(procs: list[LineWorker]) -> None:
    """Stop every worker (each one killed if it does not quit)."""
    for p in procs:
        p.close()


def row(network: str, kind: str, runs: list[dict[str, Any]], nbytes: int) -> dict[str, Any]:
    """Medians (and the fastest round) of one kind's runs."""
    sec = statistics.median(r["seconds"] for r in runs)
    cpu = statistics.median(r["cpu_seconds"] for r in runs)
    sent = [r["sent_bytes_per_node"] for r in runs if r.get("sent_bytes_per_node") is not None]
    return {"network": network, "kind": kind, "wire": wire_of(kind), "seconds": sec,
            "min_seconds": min(r["seconds"] for r in runs),
            "throughput_MBps": nbytes / sec / 1e6, "cpu_seconds": cpu,
            "cpu_s_per_GB": cpu / (nbytes / 1e9),
            "sent_MB_per_node": statistics.median(sent) / 1e6 if sent else None,
            "tx_MB_per_node": statistics.median(r.get("tx_bytes_per_node") or 0
                                                for r in runs) / 1e6,
            "max_err": max(r["max_err"] for r in runs), "runs": runs}


def compare(network: str, case: str, runs: dict[str, list[dict[str, Any]]], nbytes: int,
            extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """One network's result: a row per implementation (gloo first), and each Chaos tree's
    throughput over the baseline's: the faster gloo by median (in Chaos's processes, or
    alone). ``ratios_by_baseline`` has the ratios against each gloo row, and
    ``min_ratios`` the fastest round's against the baseline's fastest."""
    rows = [row(network, k, runs[k], nbytes) for k in runs]
    gloos = [r for r in rows if r["kind"].startswith("gloo")]
    base = min(gloos, key=lambda r: r["seconds"])
    chaos = [r for r in rows if not r["kind"].startswith("gloo")]
    by_base = {g["kind"]: {r["kind"]: g["seconds"] / r["seconds"] for r in chaos}
               for g in gloos}
    return {"network": network, "case": case, "bytes": nbytes, "goal": GOALS.get(network),
            "rows": rows, "baseline": base["kind"], "ratios": by_base[base["kind"]],
            "ratios_by_baseline": by_base,
            "min_ratios": {r["kind"]: base["min_seconds"] / r["min_seconds"] for r in chaos},
            **(extra or {})}
