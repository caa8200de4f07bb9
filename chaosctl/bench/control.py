"""``chaosctl bench control``: failure detection, failover and broker load vs cluster size.

For each cluster size it starts a real broker and N real chaosd on this box, then repeats four
faults: kill -9 and SIGSTOP of a follower, and of the scheduler. A latency is the daemon's own
event timestamp (``node-failed`` or ``scheduler-elected``) minus the wall time at which the
bench sent the signal; both clocks are this box's, so no skew enters. The broker load is
counted by a subscriber to ``chaos/<cluster>/#`` over a quiet window. After every fault the
node is brought back and the cluster must re-converge before the next one.
"""

from __future__ import annotations

import json
import signal
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaosctl.cluster import LocalCluster

FAULTS = ("kill9-follower", "sigstop-follower", "kill9-scheduler", "sigstop-scheduler")
CONVERGE_S = 60.0


@dataclass
class SizeResult:
    size: int
    samples: dict[str, list[float]] = field(default_factory=dict)  # metric -> seconds
    publish_per_s: float = 0.0
    bytes_per_s: float = 0.0
    deliveries_per_s: float = 0.0


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def summarise(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "p95": _percentile(values, 0.95),
            "max": max(values)}


def measure_load(port: int, cluster: str, seconds: float) -> tuple[float, float]:
    """Messages and bytes per second published under ``chaos/<cluster>/``."""
    import paho.mqtt.client as mqtt  # aiomqtt's own dependency

    count, size = [0], [0]

    def on_message(_c: Any, _u: Any, msg: Any) -> None:
        if not msg.retain:
            count[0] += 1
            size[0] += len(msg.payload)

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2)
    client.on_message = on_message
    client.connect("127.0.0.1", port)
    client.subscribe(f"chaos/{cluster}/#", qos=0)
    client.loop_start()
    time.sleep(0.5)
    count[0] = size[0] = 0
    time.sleep(seconds)
    n, b = count[0], size[0]
    client.loop_stop()
    client.disconnect()
    return n / seconds, b / seconds


class Runner:
    """Runs the faults on one cluster and collects the latencies."""

    def __init__(self, c: LocalCluster, result: SizeResult, say: Callable[[str], None]) -> None:
        self.c = c
        self.result = result
        self.say = say

    def add(self, metric: str, value: float) -> None:
        self.result.samples.setdefault(metric, []).append(value)

    def converge(self) -> tuple[str, int]:
        """Wait for one scheduler, everyone standby, and everyone hearing everyone."""
        size = self.c.size
        sched = self.c.wait(lambda: self.c.agreed(states={"standby": size}), CONVERGE_S,
                            "the cluster to converge")
        self.c.wait(self._all_heard, CONVERGE_S, "every node to hear every other")
        return sched

    def _all_heard(self) -> bool:
        for node in self.c.node_ids:
            rows = self.c.query(node, "nodes") or []
            ages = [r["heartbeat_age_s"] for r in rows]
            if len(ages) != self.c.size or any(a is None or a > 1.0 for a in ages):
                return False
        return True

    def fault(self, kind: str) -> None:
        sched, term = self.converge()
        on_scheduler = kind.endswith("scheduler")
        victim = sched if on_scheduler else next(n for n in self.c.node_ids if n != sched)
        observer = next(n for n in self.c.node_ids if n not in (victim, sched)) \
            if on_scheduler else sched
        sig = signal.SIGKILL if kind.startswith("kill9") else signal.SIGSTOP
        t0 = time.time()
        self.c.kill(victim, sig)
        try:
            failed = self.c.wait(
                lambda: [e for e in self.c.events(observer, "node-failed", t0)
                         if e["node"] == victim], 30, f"{victim} to be declared failed")
            self.add(f"{kind}:detect", failed[0]["ts"] - t0)
            if on_scheduler:
                elected = self.c.wait(
                    lambda: [e for e in self.c.events(observer, "scheduler-elected", t0)
                             if e["term"] > term], 30, "a new scheduler")
                self.add(f"{kind}:failover", elected[0]["ts"] - t0)
        finally:
            if sig == signal.SIGSTOP:
                self.c.kill(victim, signal.SIGCONT)
            else:
                self.c.start_node(victim)


def run_size(size: int, repeats: int, broker: str, load_s: float, workdir: Path,
             say: Callable[[str], None]) -> SizeResult:
    result = SizeResult(size=size)
    with LocalCluster(workdir / f"n{size}", size, cluster=f"bench{size}",
                      broker_kind=broker) as c:
        say(f"{size} nodes: starting {broker} and {size} chaosd")
        c.start()
        runner = Runner(c, result, say)
        runner.converge()
        say(f"{size} nodes: counting broker traffic for {load_s:g} s")
        result.publish_per_s, result.bytes_per_s = measure_load(c.port, c.cluster, load_s)
        # Every node subscribes to every heartbeat and status, so each publish fans out N times.
        result.deliveries_per_s = result.publish_per_s * size
        for r in range(1, repeats + 1):
            for kind in FAULTS:
                say(f"{size} nodes: repeat {r}/{repeats}: {kind}")
                runner.fault(kind)
        runner.converge()
    return result


def table_rows(results: list[SizeResult]) -> list[dict[str, Any]]:
    rows = []
    for res in results:
        for metric, values in sorted(res.samples.items()):
            rows.append({"nodes": res.size, "metric": metric, **summarise(values)})
    return rows


def write_outputs(out: Path, results: list[SizeResult], meta: dict[str, Any]) -> list[Path]:
    """JSON with every sample, a markdown table, and a PNG if matplotlib is installed."""
    out.mkdir(parents=True, exist_ok=True)
    rows = table_rows(results)
    (out / "control.json").write_text(json.dumps(
        {"meta": meta, "results": [asdict(r) for r in results], "summary": rows}, indent=2))
    lines = ["| nodes | metric | n | p50 (s) | p95 (s) | max (s) |",
             "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['nodes']} | {r['metric']} | {r['n']} | {r['p50']:.3f} | {r['p95']:.3f} "
              f"| {r['max']:.3f} |" for r in rows]
    lines += ["", "| nodes | broker publishes/s | bytes/s | deliveries/s (publishes x N) |",
              "|---:|---:|---:|---:|"]
    lines += [f"| {r.size} | {r.publish_per_s:.1f} | {r.bytes_per_s:.0f} | "
              f"{r.deliveries_per_s:.0f} |" for r in results]
    (out / "control.md").write_text("\n".join(lines) + "\n")
    written = [out / "control.json", out / "control.md"]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    metrics = sorted({m for r in results for m in r.samples})
    fig, ax = plt.subplots(figsize=(9, 4.5))
    width = 0.8 / max(1, len(results))
    for i, res in enumerate(results):
        xs = [j + i * width for j in range(len(metrics))]
        ys = [statistics.median(res.samples.get(m, [0.0])) for m in metrics]
        ax.bar(xs, ys, width, label=f"{res.size} nodes")
    ax.set_xticks([j + width * (len(results) - 1) / 2 for j in range(len(metrics))])
    ax.set_xticklabels([m.replace(":", "\n") for m in metrics], fontsize=8)
    ax.set_ylabel("median latency (s)")
    ax.set_title("chaosd failure detection and failover vs cluster size")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "control.png", dpi=120)
    plt.close(fig)
    return [*written, out / "control.png"]


def run(sizes: list[int], repeats: int, broker: str, load_s: float, out: Path,
        say: Callable[[str], None]) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="chaos-bench-") as tmp:
        for size in sizes:
            results.append(run_size(size, repeats, broker, load_s, Path(tmp), say))
    meta = {"sizes": sizes, "repeats": repeats, "broker": broker, "load_seconds": load_s,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    for path in write_outputs(out, results, meta):
        say(f"wrote {path}")
    return table_rows(results)
