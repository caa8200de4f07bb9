"""Throwaway: heartbeat ages at the scheduler while 4 workers saturate 2 cores, [worker] nice
0 against 5. Usage: python /tmp/nice_exp.py NICE SECONDS OUT.json"""
from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from chaosctl.client import call_once
from chaosctl.cluster import LocalCluster

nice, seconds, out = int(sys.argv[1]), float(sys.argv[2]), Path(sys.argv[3])
with tempfile.TemporaryDirectory() as tmp, LocalCluster(
        Path(tmp) / "c", 4, cluster="nice", broker_kind="mosquitto",
        config=f"[worker]\nnice = {nice}\n") as c:
    c.start()
    c.wait(lambda: c.agreed(), 30, "a scheduler")
    ids = c.node_ids
    for i, node in enumerate(ids):
        argv = [sys.executable, "-m", "chaos_bench.stall.worker", "--steps", "100000000",
                "--sleep", "0", "--width", "512", "--out", str(Path(tmp) / f"{node}.jsonl")]
        call_once(c.socket_of(node), "join", {"neighbors": ids[max(0, i - 1):i],
                                              "command": argv}, timeout=10)
        c.wait(lambda n=node: any(r["id"] == n and r["state"] == "active"
                                  for r in c.query(ids[0], "nodes") or []), 120, f"{node}")
    sched = next(n for n in ids if (c.query(n, "status") or {}).get("scheduler", {}) and
                 c.query(n, "status")["scheduler"]["id"] == n)
    ages: dict[str, list[float]] = {n: [] for n in ids if n != sched}
    t0 = time.time()
    failed0 = len(c.events(sched, "node-failed"))
    while time.time() - t0 < seconds:
        for r in c.query(sched, "nodes") or []:
            if r["id"] in ages and r["heartbeat_age_s"] is not None:
                ages[r["id"]].append(r["heartbeat_age_s"])
        time.sleep(0.1)
    failed = len(c.events(sched, "node-failed")) - failed0
    steps = {n: (Path(tmp) / f"{n}.jsonl").read_text().count("\n") for n in ids}
    allv = sorted(v for vs in ages.values() for v in vs)
    doc = {"nice": nice, "seconds": seconds, "samples": len(allv),
           "age_p50": statistics.median(allv), "age_p99": allv[int(0.99 * len(allv))],
           "age_max": allv[-1], "over_1s": sum(v > 1.0 for v in allv),
           "node_failed": failed, "steps": steps}
    out.write_text(json.dumps(doc, indent=1))
    print(json.dumps(doc))
