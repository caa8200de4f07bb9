"""Time from the daemons' return to the first step trained again after a power cut.

Run from the repository root: ``python bench/results/powercut/measure.py REPEATS OUT.json``.
Three nodes on a real mosquitto train with snapshots every 20 steps; every daemon and worker
is killed with SIGKILL at once (the power-cut e2e test's harness, tests/training/
test_power_cut.py), the daemons start again on the same data dirs, and the time to the first
step any node trains again, and to every node's, is taken. One JSON row per repeat.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from chaosctl.cluster import LocalCluster
from tests.training._run import Run
from tests.training.test_power_cut import (
    CONFIG,
    EVERY_STEPS,
    power_cut,
    snapshot_steps,
)


def once(rep: int) -> dict[str, float | int]:
    tmp = Path(tempfile.mkdtemp(prefix="powercut-"))
    c = LocalCluster(tmp / "c", 3, cluster="train", broker_kind="mosquitto", config=CONFIG)
    r = Run(c, tmp)
    try:
        c.start()
        c.wait(lambda: c.agreed(states={"standby": 3}), 30, "a scheduler")
        ids = c.node_ids
        for n in ids:
            r.join(n)
            c.wait(lambda n=n: r.active([n]), 60, f"{n} active")
        r.advance(ids, 3 * EVERY_STEPS)
        c.wait(lambda: all(snapshot_steps(r, n) for n in ids), 60, "a snapshot on every box")
        power_cut(r, ids)
        reached = max(r.step(n) for n in ids)
        newest = max(max(snapshot_steps(r, n)) for n in ids)
        marks = {n: len(r.records(n)) for n in ids}
        t0 = time.monotonic()
        for n in ids:
            c.start_node(n)
        c.wait(lambda: any(len(r.records(n)) > marks[n] for n in ids), 120, "a step")
        first = time.monotonic() - t0
        c.wait(lambda: all(len(r.records(n)) > marks[n] for n in ids), 120, "every node")
        return {"rep": rep, "reached": reached, "restored": newest,
                "steps_lost": reached - newest, "first_step_s": round(first, 2),
                "every_member_s": round(time.monotonic() - t0, 2)}
    finally:
        for n in c.node_ids:
            pid = r.worker_pid(n) if c.nodes[n].alive() else 0
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
        c.close(grace=5.0)


if __name__ == "__main__":
    rows = []
    for i in range(int(sys.argv[1])):
        rows.append(once(i))
        print(json.dumps(rows[-1]), flush=True)
    Path(sys.argv[2]).write_text(json.dumps(rows, indent=1) + "\n")
