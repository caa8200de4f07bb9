"""The per-namespace processes of ``chaosctl bench scaleout`` (run with ``python -m``).

``serve``: an existing node. It maps the shared state file read-only (the page cache holds one
copy for every node), serves it with :func:`chaos_edge.replication.transfer.serve` on
``0.0.0.0:PORT`` inside its namespace, and relays ``GET_VIA`` requests to its testbed
neighbours (``--peers``). With ``--plain-port`` it also serves the ``plain`` baseline's bare
sockets (:mod:`chaos_bench.scaleout.plain`). A thread samples the server's counters every
10 ms, so the node can report how long it was busy with replication: from the first request it
got after ``mark`` to the last byte it sent or relayed.

Before every run, both read a byte of every page of the mapped state (:func:`resident`), so no
strategy is timed reading a state file that the page cache dropped.

``join``: the new node. It runs one strategy per ``run NAME`` line with
:func:`chaos_edge.replication.transfer.run_strategy` on the job given as JSON (``--job``), checks
the received bytes against the manifest's block checksums once more, and answers one JSON line.
``NAME`` is a strategy, or a bench variant of one from :data:`VARIANTS` (``chaos-paper``: the
``chaos`` strategy with the paper's planner), or ``plain``: plain sockets from the job's
``plain_addresses``, the water-filling split of the state as one segment, verified after the
clock stops.

Both speak a line protocol on stdin/stdout with the bench (one JSON answer per command line);
``quit`` (or EOF) ends them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from chaos_bench.models import map_state
from chaos_bench.scaleout import plain as scaleout_plain
from chaos_bench.workers import answer
from chaos_edge.dataplane import auth
from chaos_edge.replication.manifest import Manifest, verify_buffer
from chaos_edge.replication.planning.model import Neighbor, PlanInput, merge_ranges
from chaos_edge.replication.planning.planner import make_plan
from chaos_edge.replication.transfer import (
    FetchOptions,
    ScaleOutJob,
    Snapshot,
    StateServer,
    run_strategy,
    serve,
)

SECRET = b"chaos-bench-scaleout"
SAMPLE_S = 0.01
PAGE = 4096
#: Bench variants: name -> (strategy, planner); a plain strategy keeps the job's planner.
VARIANTS = {"chaos-paper": ("chaos", "paper")}


def ident(node: str) -> auth.Identity:
    """The bench's credentials for ``node`` (one shared secret, as in a cluster)."""
    return auth.Identity(node, "bench", SECRET, auth.new_incarnation())


def resident(data: memoryview) -> None:
    """Read a byte of every page of the mapped state before a clock starts.

    A real source serves a snapshot in its RAM, but here the state is a file, and on a shared
    box the page cache may have dropped part of it (other processes, the stop-resume
    checkpoints): a strategy would then be timed reading the disk, and whichever ran first
    would pay for it. This also maps every page into the process, so no strategy pays the
    page faults either.
    """
    int(np.frombuffer(data, dtype=np.uint8)[::PAGE].sum())


class BusyMeter:
    """Samples a server's counters: when did it start and stop moving replication bytes?"""

    def __init__(self, server: StateServer) -> None:
        self.server = server
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.mark()
        threading.Thread(target=self._loop, daemon=True).start()

    def _totals(self) -> tuple[int, int, int]:
        s = self.server.stats()
        return s.requests, s.bytes_sent, s.bytes_relayed

    def mark(self) -> None:
        """Start a new measurement window."""
        with self.lock:
            self.base = self._totals()
            self.last = self.base
            self.first_s: float | None = None
            self.last_s: float | None = None

    def _loop(self) -> None:
        while not self.stop.wait(SAMPLE_S):
            now, cur = time.monotonic(), self._totals()
            with self.lock:
                if cur[0] > self.last[0] and self.first_s is None:
                    self.first_s = now - SAMPLE_S / 2  # the request came within the interval
                if cur[1:] != self.last[1:]:
                    self.last_s = now
                self.last = cur

    def report(self) -> dict[str, Any]:
        """The window since :meth:`mark`: busy seconds and bytes."""
        time.sleep(2 * SAMPLE_S)  # let the sampler see the last bytes
        with self.lock:
            busy = 0.0
            if self.first_s is not None and self.last_s is not None:
                busy = max(0.0, self.last_s - self.first_s)
            return {
                "busy_s": busy,
                "requests": self.last[0] - self.base[0],
                "bytes_sent": self.last[1] - self.base[1],
                "bytes_relayed": self.last[2] - self.base[2],
            }


def serve_main(args: argparse.Namespace) -> None:
    """An existing node: serve, relay, and report busy windows."""
    manifest = Manifest.from_json(Path(args.manifest).read_text())
    data = map_state(args.state)
    peers = {k: (h, int(p)) for k, (h, p) in json.loads(args.peers).items()}
    server = serve(
        Snapshot.create(manifest, data), ident(args.node), host="0.0.0.0", port=args.port,
        peers=peers, io_timeout=60.0,
    )
    resident(data)
    meter = BusyMeter(server)
    plain = None if args.plain_port < 0 else scaleout_plain.PlainServer(data, port=args.plain_port)
    answer({"ready": list(server.address), **({"plain": plain.port} if plain else {})})
    for line in sys.stdin:
        cmd = line.strip()
        if cmd == "mark":
            resident(data)
            meter.mark()
            answer({"ok": True})
        elif cmd == "report":
            answer(meter.report())
        elif cmd == "quit":
            break
    meter.stop.set()
    server.close()
    if plain is not None:
        plain.close()


def _neighbors(rows: list[list[Any]]) -> tuple[Neighbor, ...]:
    return tuple(Neighbor(str(i), float(p), float(t)) for i, p, t in rows)


def join_main(args: argparse.Namespace) -> None:
    """The new node: run the strategies it is asked for, one at a time."""
    manifest = Manifest.from_json(Path(args.manifest).read_text())
    data = map_state(args.state)
    spec = json.loads(Path(args.job).read_text())
    job = ScaleOutJob(
        manifest=manifest,
        me=ident(args.node),
        neighbors=_neighbors(spec["neighbors"]),
        addresses={k: (h, int(p)) for k, (h, p) in spec["addresses"].items()},
        sources=_neighbors(spec["sources"]),
        routes={k: list(v) for k, v in spec["routes"].items()},
        checkpoints={n: data for n in spec["checkpoint_nodes"]},
        workdir=Path(args.workdir),
        planner=spec.get("planner", "chaos"),
        options=FetchOptions(io_timeout=float(spec.get("io_timeout", 60.0))),
    )
    answer({"ready": True})
    for line in sys.stdin:
        words = line.split()
        if not words or words[0] == "quit":
            break
        name = words[1]
        resident(data)  # stop-resume writes its checkpoints from it
        if name == "plain":
            answer(plain_run(job, spec))
            continue
        strategy, planner = VARIANTS.get(name, (name, job.planner))
        try:
            res = run_strategy(strategy, dataclasses.replace(job, planner=planner))
        except Exception as exc:  # report it; the bench decides
            answer({"strategy": name, "error": f"{type(exc).__name__}: {exc}"})
            continue
        t0 = time.perf_counter()
        bad = verify_buffer(manifest, res.buffer)
        doc: dict[str, Any] = {
            "strategy": name,
            "delay_s": res.delay_s,
            "decision_s": res.decision_s,
            "phases": res.phases,
            "verified": not bad and len(res.buffer) == manifest.total_bytes,
            "verify_s": time.perf_counter() - t0,
        }
        if res.fetch is not None:
            doc["sources"] = {
                s: [t.start_s, t.end_s, t.bytes, t.failed, t.taken_bytes, t.given_bytes]
                for s, t in res.fetch.sources.items()
            }
            doc["refetched_blocks"] = len(res.fetch.refetched_blocks)
            doc["steals"] = len(res.fetch.steals)
        if res.plan is not None:
            doc["plan_bytes"] = {s: sum(n for _, n in r) for s, r in res.plan.ranges.items()}
            doc["planner"] = res.plan.planner
            doc["plan_makespan_s"] = res.plan.makespan_s
        del res
        answer(doc)


def plain_run(job: ScaleOutJob, spec: dict[str, Any]) -> dict[str, Any]:
    """The ``plain`` baseline: the water-filling split of one segment over plain sockets."""
    m = job.manifest
    addrs = {k: (h, int(p)) for k, (h, p) in spec.get("plain_addresses", {}).items()}
    nbrs = [n for n in job.neighbors if n.id in addrs]
    try:
        if not nbrs:
            raise ValueError("the job has no plain_addresses for its neighbours")
        plan = make_plan("waterfill", PlanInput.create(nbrs, [m.total_bytes]))
        ranges = {}
        for s, rs in plan.ranges.items():
            merged = merge_ranges(rs)
            if len(merged) > 1:
                raise ValueError(f"water-filling gave {s} {len(merged)} ranges, not one")
            ranges[s] = merged[0] if merged else (0, 0)
        buf = bytearray(m.total_bytes)
        res = scaleout_plain.pull(addrs, ranges, buf)
    except (OSError, ValueError) as exc:
        return {"strategy": "plain", "error": f"{type(exc).__name__}: {exc}"}
    t0 = time.perf_counter()
    bad = verify_buffer(m, buf)
    return {
        "strategy": "plain",
        "delay_s": res.delay_s,
        "decision_s": 0.0,
        "phases": {"transfer": res.delay_s},
        "verified": not bad,
        "verify_s": time.perf_counter() - t0,
        "sources": {s: [0.0, e, n, None, 0, 0] for s, (e, n) in res.sources.items()},
        "plan_bytes": {s: n for s, (_, n) in ranges.items()},
        "planner": "waterfill",
        "plan_makespan_s": plan.makespan_s,
    }


def main(argv: list[str] | None = None) -> None:
    """Parse the sub-command and run it."""
    ap = argparse.ArgumentParser(prog="python -m chaos_bench.scaleout.node")
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name in ("serve", "join"):
        p = sub.add_parser(name)
        p.add_argument("--node", required=True)
        p.add_argument("--state", required=True, help="the state file (synthetic bytes)")
        p.add_argument("--manifest", required=True, help="its manifest (JSON file)")
    s = sub.choices["serve"]
    s.add_argument("--port", type=int, required=True)
    s.add_argument("--peers", default="{}", help="JSON: neighbour -> [host, port] for relays")
    s.add_argument("--plain-port", type=int, default=-1,
                   help="also serve the plain baseline's sockets here (0: any port; -1: no)")
    j = sub.choices["join"]
    j.add_argument("--job", required=True, help="JSON file: neighbours, sources, routes, ...")
    j.add_argument("--workdir", required=True, help="where stop-resume writes checkpoints")
    args = ap.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        (serve_main if args.cmd == "serve" else join_main)(args)


if __name__ == "__main__":
    main()
