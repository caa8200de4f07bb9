"""``chaosctl bench control``: failure detection, failover and broker load vs cluster size.

For each cluster size it starts a real broker and N real chaosd on this box, then repeats four
faults: kill -9 and SIGSTOP of a follower, and of the scheduler. A latency is the daemon's own
event timestamp (``node-failed`` or ``scheduler-elected``) minus the wall time at which the
bench sent the signal; both clocks are this box's, so no skew enters. The broker load is
counted by a subscriber to ``chaos/<cluster>/#`` over a quiet window. After every fault the
node is brought back and the cluster must re-converge before the next one.

The broker's load is its own count (mosquitto's ``$SYS`` counters, :mod:`.brokerload`): the
publishes it receives, the deliveries it makes to subscribers, bytes, and its CPU, over a
quiet window on the converged cluster. Deliveries are what grows with the subscriptions: a
follower hears only the scheduler's heartbeats, so they grow as N, not N^2.
"""

from __future__ import annotations

import signal
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from chaos_bench.control import brokerload
from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaosctl.cluster import LocalCluster
from chaosctl.common import console

FAULTS = ("kill9-follower", "sigstop-follower", "kill9-scheduler", "sigstop-scheduler")
CONVERGE_S = 60.0


@dataclass
class SizeResult:
    size: int
    samples: dict[str, list[float]] = field(default_factory=dict)  # metric -> seconds
    load: brokerload.BrokerLoad | None = None  # None on the embedded broker (no $SYS)


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    idx = min(len(ordered) - 1, max(0, round(q * (len(ordered) - 1))))
    return ordered[idx]


def summarise(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50": statistics.median(values), "p95": _percentile(values, 0.95),
            "max": max(values)}


class Runner:
    """Runs the faults on one cluster and collects the latencies."""

    def __init__(self, c: LocalCluster, result: SizeResult, say: Say) -> None:
        self.c = c
        self.result = result
        self.say = say

    def add(self, metric: str, value: float) -> None:
        self.result.samples.setdefault(metric, []).append(value)

    def converge(self) -> tuple[str, int]:
        """Wait for one scheduler, everyone standby, the scheduler hearing every node and
        every node hearing the scheduler (followers need not hear each other)."""
        size = self.c.size
        sched = self.c.wait(lambda: self.c.agreed(states={"standby": size}), CONVERGE_S,
                            "the cluster to converge")
        self.c.wait(lambda: self._all_heard(sched[0]), CONVERGE_S,
                    "the scheduler and every node to hear each other")
        return sched

    def _all_heard(self, sched: str) -> bool:
        rows = self.c.query(sched, "nodes") or []
        if len(rows) != self.c.size or any(_stale(r) for r in rows):
            return False
        for node in self.c.node_ids:
            rows = self.c.query(node, "nodes") or []
            if not [r for r in rows if r["id"] == sched and not _stale(r)]:
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


def _stale(row: dict[str, Any]) -> bool:
    age = row["heartbeat_age_s"]
    return age is None or age > 1.0


def run_size(size: int, repeats: int, broker: str, load_s: float, workdir: Path,
             say: Say) -> SizeResult:
    result = SizeResult(size=size)
    with LocalCluster(workdir / f"n{size}", size, cluster=f"bench{size}", broker_kind=broker,
                      mosquitto_conf=brokerload.MOSQUITTO_CONF) as c:
        say(f"{size} nodes: starting {broker} and {size} chaosd")
        c.start()
        runner = Runner(c, result, say)
        runner.converge()
        if broker == "mosquitto" and c.broker is not None and c.broker.proc is not None:
            say(f"{size} nodes: reading the broker's $SYS counters for {load_s:g} s")
            result.load = brokerload.measure(c.port, c.broker.proc.pid, load_s)
        else:
            say(f"{size} nodes: the {broker} broker has no $SYS counters; no load figures")
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


def load_rows(results: list[SizeResult]) -> list[dict[str, Any]]:
    """Broker load per size, and deliveries relative to the smallest size measured."""
    measured = [r for r in results if r.load is not None]
    base = min(measured, key=lambda r: r.size) if measured else None
    rows = []
    for res in measured:
        load = res.load
        assert load is not None and base is not None and base.load is not None
        ratio = load.deliveries_per_s / base.load.deliveries_per_s \
            if base.load.deliveries_per_s else 0.0
        rows.append({"nodes": res.size, **asdict(load), "deliveries_ratio": ratio,
                     "linear_ratio": res.size / base.size,
                     "quadratic_ratio": (res.size / base.size) ** 2})
    return rows


def write_outputs(output: Output, results: list[SizeResult], meta: dict[str, Any]) -> None:
    """JSON with every sample, a markdown table, and a PNG if matplotlib is installed."""
    rows, loads = table_rows(results), load_rows(results)
    output.json("control.json", {"meta": meta, "results": [asdict(r) for r in results],
                                 "summary": rows, "load": loads})
    lines = ["| nodes | metric | n | p50 (s) | p95 (s) | max (s) |",
             "|---:|---|---:|---:|---:|---:|"]
    lines += [f"| {r['nodes']} | {r['metric']} | {r['n']} | {r['p50']:.3f} | {r['p95']:.3f} "
              f"| {r['max']:.3f} |" for r in rows]
    lines += ["", "| nodes | publishes/s in | deliveries/s out | x smallest (linear, N^2) "
              "| kB/s in | kB/s out | broker CPU % |", "|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['nodes']} | {r['publishes_per_s']:.1f} | {r['deliveries_per_s']:.1f} | "
              f"{r['deliveries_ratio']:.2f} ({r['linear_ratio']:g}, {r['quadratic_ratio']:g}) | "
              f"{r['bytes_in_per_s'] / 1000:.1f} | {r['bytes_out_per_s'] / 1000:.1f} | "
              f"{r['cpu_percent']:.1f} |" for r in loads]
    output.text("control.md", "\n".join(lines))
    output.figure("control.png", lambda plt: draw(plt, results, loads), dpi=120)


def draw(plt: Any, results: list[SizeResult], loads: list[dict[str, Any]]) -> Any:
    """Latency per fault and size, and the broker's fan-out against N and N^2."""
    metrics = sorted({m for r in results for m in r.samples})
    fig, (ax, lax) = plt.subplots(1, 2, figsize=(13, 4.5), width_ratios=(2, 1))
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
    if loads:
        xs = [r["nodes"] for r in loads]
        lax.plot(xs, [r["deliveries_per_s"] for r in loads], "o-", label="measured")
        base = loads[0]["deliveries_per_s"]
        lax.plot(xs, [base * r["linear_ratio"] for r in loads], "--", label="linear")
        lax.plot(xs, [base * r["quadratic_ratio"] for r in loads], ":", label="quadratic")
        lax.set_xlabel("nodes")
        lax.set_ylabel("broker deliveries/s ($SYS)")
        lax.set_title("broker fan-out")
        lax.legend()
    return fig


def run(sizes: list[int], repeats: int, broker: str, load_s: float, out: Path,
        say: Say) -> list[dict[str, Any]]:
    results = []
    with tempfile.TemporaryDirectory(prefix="chaos-bench-") as tmp:
        for size in sizes:
            results.append(run_size(size, repeats, broker, load_s, Path(tmp), say))
    meta = {"sizes": sizes, "repeats": repeats, "broker": broker, "load_seconds": load_s,
            "when": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    write_outputs(Output(out, say), results, meta)
    print_load(load_rows(results))
    return table_rows(results)


def print_load(loads: list[dict[str, Any]]) -> None:
    """The broker-load table (the latency table is the CLI's)."""
    if not loads:
        return
    from rich.table import Table

    table = Table(title="broker load on the converged cluster (mosquitto $SYS)")
    for col in ("nodes", "publishes/s", "deliveries/s", "x smallest", "linear", "kB/s out",
                "broker CPU %"):
        table.add_column(col, justify="right")
    for r in loads:
        table.add_row(str(r["nodes"]), f"{r['publishes_per_s']:.1f}",
                      f"{r['deliveries_per_s']:.1f}", f"{r['deliveries_ratio']:.2f}",
                      f"{r['linear_ratio']:g}", f"{r['bytes_out_per_s'] / 1000:.1f}",
                      f"{r['cpu_percent']:.1f}")
    console.print(table)
