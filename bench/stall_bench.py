"""Training-loop stall caused by scale-in, connect-link and disconnect-link (paper Table I).

Runs a LocalCluster (real broker, real chaosd, real workers via ``chaosctl join``), trains
tests/training/_worker.py on every node, then repeats each primitive ``--events`` times:

- ``connect-link`` / ``disconnect-link``: ``chaosctl link add|del`` between two members;
- ``scale-in``: a graceful ``chaosctl leave`` of a node, which then rejoins (scale-out, not
  measured here).

The stall of one event is what the workers report (``worker.report stall``: the time
``update()`` spent beyond the plain all-reduce: agreement, reruns, waiting for the policy),
which the scheduler attaches to the event as ``stall_ms``; we read ``chaosctl events --json``
and print p50/p99 per kind. Numbers are reported, never asserted.

    python bench/stall_bench.py --nodes 4 --events 50 --out bench/results/stall.json

Status: skeleton; it needs the scheduler to attach ``stall_ms`` to the events (it does, by
``policy_version``) and was not run to completion in the session that wrote it.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from chaosctl.cluster import LocalCluster

WORKER = Path(__file__).resolve().parent.parent / "tests" / "training" / "_worker.py"


def ctl(cluster: LocalCluster, node: str, *args: str) -> subprocess.CompletedProcess[str]:
    """Run chaosctl against ``node``'s socket."""
    return subprocess.run([sys.executable, "-m", "chaosctl.main", "--socket",
                           str(cluster.socket_of(node)), *args],
                          capture_output=True, text=True, timeout=30)  # fmt: skip


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=4)
    ap.add_argument("--events", type=int, default=50)
    ap.add_argument("--out", default="")
    ap.add_argument("--link-events", type=int, default=50)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, LocalCluster(Path(tmp), args.nodes) as cluster:
        cluster.start()
        ids = cluster.node_ids
        cluster.wait(lambda: cluster.agreed(), 30, "a scheduler")
        for node in ids:
            out = Path(tmp) / f"{node}.jsonl"
            ctl(cluster, node, "join", "--", sys.executable, str(WORKER), "--steps", "100000",
                "--sleep", "0.01", "--out", str(out))
            time.sleep(0.5)
        a, b = ids[0], ids[-1]
        for _ in range(args.link_events):
            ctl(cluster, a, "link", "add", b)
            time.sleep(0.3)
            ctl(cluster, a, "link", "del", b)
            time.sleep(0.3)
        def worker_gone(node: str) -> bool:
            info = cluster.query(node, "ping") or {}
            return not (info.get("worker") or {}).get("pid")

        def active(node: str) -> bool:
            rows = cluster.query(a, "nodes") or []
            return any(r["id"] == node and r["state"] == "active" for r in rows)

        for i in range(args.events):
            node = ids[1 + i % (len(ids) - 1)]
            ctl(cluster, node, "leave")
            cluster.wait(lambda node=node: worker_gone(node), 60, f"{node}'s worker to leave")
            ctl(cluster, node, "join", "--", sys.executable, str(WORKER), "--steps", "100000",
                "--sleep", "0.01", "--out", str(Path(tmp) / f"{node}.jsonl"))
            cluster.wait(lambda node=node: active(node), 90, f"{node} to rejoin")
            print(f"scale-in {i + 1}/{args.events}", file=sys.stderr, flush=True)
        time.sleep(2.0)  # the last stall reports reach the scheduler
        events = json.loads(ctl(cluster, a, "events", "--json", "--limit", "1000").stdout
                            or "[]")
    result: dict[str, dict[str, float]] = {}
    for kind in ("scale-in", "connect-link", "disconnect-link"):
        rows = [e for e in events if e.get("kind") == kind]
        # Workers report a stall only when it exceeds 1 ms or forced a rerun; an event with
        # no report stalled no worker by more than 1 ms. Both views are printed.
        reported = [float(e["stall_ms"]) for e in rows if e.get("stall_ms") is not None]
        bounded = reported + [1.0] * (len(rows) - len(reported))
        if rows:
            result[kind] = {
                "events": len(rows), "reported": len(reported),
                "p50_ms_upper": statistics.median(bounded),
                "p99_ms_upper": percentile(bounded, 99),
                "p50_ms_reported": statistics.median(reported) if reported else 0.0,
                "p99_ms_reported": percentile(reported, 99) if reported else 0.0,
            }
    print(json.dumps(result, indent=2))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
