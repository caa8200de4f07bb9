"""Training-loop stall caused by the primitives (the paper's Table I: under 1 ms).

    chaosctl bench stall --model cnn --events 30 --gap 1 --out bench/results/stall-cnn

Runs a LocalCluster (a real broker, real chaosd, real workers through ``chaosctl join``) that
trains :mod:`chaos_bench.stall.worker` (``--model``: the tests' MLP, the shipped CNN or char
transformer, or a 25M-parameter dense model) on a chain ``node-1 - node-2 - ... - node-N``,
then:

- ``connect-link`` / ``disconnect-link``: ``chaosctl link add|del`` between the chain's ends,
  ``--events`` times each (the chain stays connected, so no partition);
- ``scale-in``: a graceful ``chaosctl leave`` of the chain's last node, which then rejoins
  (a ``scale-out``), ``--events`` times.

Each worker uses one torch thread (the nodes share this box's cores, and several thread pools
spinning against each other would be a cost no separate box pays) and the Trainer's default
all-reduce chunks. Every worker writes, for each committed step, how long ``update()`` took and
its *stall*: the part outside the collectives (agreement and all-reduce, whose waits for the
slowest peer the step pays anyway): polling chaosd, waiting for a policy, reruns,
``optimizer.step()``, a snapshot for a new node; and, inside the stall, the optimizer's step, so
that the report gives Chaos's own cost (the stall less the optimizer step) apart. An event
touches the first step run under the policy it made and, for a scale-out, the step at which the
sources took their snapshot (the joining node's own first step is left out: it is not a stall of
the nodes that were training). Per event we report the largest stall over the nodes at those
steps, and the *step excess*: the largest amount by which such a step took longer than that
node's median step. The baseline is the same largest stall over the nodes, at the steps at which
no policy changed: what a step costs beyond its collectives anyway. ``--from DIR`` reports again
on what a ``--keep DIR`` run left.
Prints a table, writes ``stall.json``, ``stall.md`` and (with matplotlib) ``stall.png``.
"""

from __future__ import annotations

import functools
import itertools
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

from chaos_bench.output import Output, keep_copy
from chaos_bench.progress import Say
from chaos_bench.workers import records
from chaosctl.client import CtlUsageError, call_once
from chaosctl.cluster import LocalCluster

WORKER_MODULE = "chaos_bench.stall.worker"  # shipped in the package, run with -m
Rows = dict[str, list[dict[str, Any]]]
KINDS = ("connect-link", "disconnect-link", "scale-in", "scale-out")


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered)) - 1))]


def event_rows(ev: dict[str, Any], node_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A node's rows at the steps the event touched: the first step run under the policy it
    made, and for a scale-out the step at which the sources took their snapshot."""
    out = [next((r for r in node_rows if r.get("policy_version") == ev.get("policy_version")),
                None)]  # fmt: skip
    if ev["kind"] == "scale-out" and isinstance(ev.get("version"), int):
        out += [r for r in node_rows if r["step"] == ev["version"]]
    return [r for r in out if r is not None]


def is_baseline(prev: dict[str, Any], row: dict[str, Any]) -> bool:
    """A step run under the same policy as the step before it."""
    return row["step"] == prev["step"] + 1 and row["policy_version"] == prev["policy_version"]


def framework_ms(row: dict[str, Any]) -> float:
    """A step's stall less its optimizer step: what Chaos itself cost the step (rows written
    before the optimizer was timed apart count it all as the framework's)."""
    return float(row["stall_ms"]) - float(row.get("optimizer_ms", 0.0))


def event_cost(ev: dict[str, Any], rows: dict[str, list[dict[str, Any]]],
               typical: dict[str, float]) -> tuple[float, float, float] | None:
    """(stall beyond the collectives, step time beyond the node's typical step, the stall
    less the optimizer step), each the largest over the nodes; None if no node ran the steps
    the event touched."""
    stall, excess, own = [], [], []
    for node, node_rows in rows.items():
        if ev["kind"] == "scale-out" and node == ev.get("node"):
            continue  # the new node's own first step (warm-up) is no stall of the others
        for r in event_rows(ev, node_rows):
            stall.append(float(r["stall_ms"]))
            excess.append(float(r["update_ms"]) - typical[node])
            own.append(framework_ms(r))
    return (max(stall), max(excess), max(own)) if stall else None


class Baseline(NamedTuple):
    """The steps under an unchanged policy, each the largest over the nodes (as for an
    event: the max of several draws is larger than one draw)."""

    stalls: list[float]
    framework: list[float]
    optimizer: list[float]  # every node's optimizer step at those steps, not a max
    typical: dict[str, float]  # each node's median step time


def baseline(rows: dict[str, list[dict[str, Any]]]) -> Baseline:
    """The stall of each step under an unchanged policy, and each node's median step."""
    by_step: dict[int, list[dict[str, Any]]] = {}
    changed: set[int] = set()
    typical = {}
    for node, node_rows in rows.items():
        times = []
        for prev, row in itertools.pairwise(node_rows):
            if is_baseline(prev, row):
                by_step.setdefault(int(row["step"]), []).append(row)
                times.append(float(row["update_ms"]))
            else:
                changed.add(int(row["step"]))
        typical[node] = statistics.median(times) if times else 0.0
    steps = [v for step, v in sorted(by_step.items()) if step not in changed]
    return Baseline([max(float(r["stall_ms"]) for r in v) for v in steps],
                    [max(framework_ms(r) for r in v) for v in steps],
                    [float(r.get("optimizer_ms", 0.0)) for v in steps for r in v], typical)


def summarize(values: list[float]) -> dict[str, float]:
    return {"p50_ms": round(statistics.median(values), 3),
            "p99_ms": round(percentile(values, 99), 3), "max_ms": round(max(values), 3)}


def describe(model: str) -> dict[str, Any]:
    """The model the workers train: its name, parameters and state bytes (the parameters
    and Adam's two moments, all float32)."""
    from chaos_bench.stall.worker import build  # torch: only when a run is made

    params = sum(p.numel() for p in build(model, 16)[0].parameters())
    return {"name": model, "parameters": params, "state_mb": round(params * 12 / 1e6, 2)}


def run_cluster(nodes: int, events: int, gap: float, tmp: Path, say: Say,
                digest_every: int | None = None, model: str = "mlp"
                ) -> tuple[list[dict[str, Any]], Rows]:
    """Train on a chain, cause the events; returns the daemon's event log and the step rows."""
    kind = "mosquitto" if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists() \
        else "embedded"
    say(f"{nodes} chaosd with {kind}, workers joining as a chain")
    with LocalCluster(tmp / "c", nodes, cluster="stall", broker_kind=kind) as c:
        c.start()
        c.wait(lambda: c.agreed(), 30, "a scheduler")
        ids = c.node_ids

        def join(node: str, nbrs: list[str]) -> None:
            argv = [sys.executable, "-m", WORKER_MODULE, "--steps", "1000000", "--sleep", "0.01",
                    "--model", model, "--no-digest", "--threads", "1", "--chunk", "0",
                    "--out", str(tmp / f"{node}.jsonl")]
            if digest_every is not None:
                argv += ["--digest-every", str(digest_every)]
            call_once(c.socket_of(node), "join", {"neighbors": nbrs, "command": argv},
                      timeout=10)

        def active(node: str) -> bool:
            return any(r["id"] == node and r["state"] == "active"
                       for r in c.query(ids[0], "nodes") or [])

        def worker_gone(node: str) -> bool:
            return not ((c.query(node, "ping") or {}).get("worker") or {}).get("pid")

        for i, node in enumerate(ids):
            join(node, ids[i - 1 : i])  # a chain
            c.wait(functools.partial(active, node), 90, f"{node} to join")
        a, b = ids[0], ids[-1]
        for i in range(events):
            for action in ("add", "del"):
                call_once(c.socket_of(a), "link", {"action": action, "peer": b}, timeout=10)
                time.sleep(gap)
            say(f"link add/del {i + 1}/{events}")
        for i in range(events):
            call_once(c.socket_of(b), "leave", timeout=10)
            c.wait(lambda: worker_gone(b), 60, f"{b}'s worker to leave")
            join(b, [ids[-2]])
            c.wait(lambda: active(b), 120, f"{b} to rejoin")
            say(f"leave and rejoin {i + 1}/{events}")
        time.sleep(2.0)  # the last rows reach the files
        # All of them (the daemon keeps the last 1000; the default answer is the last 200).
        log = call_once(c.socket_of(a), "events", {"limit": 0}, timeout=10) or []
    return log, {n: records(tmp / f"{n}.jsonl") for n in ids}


def report(events: list[dict[str, Any]], rows: Rows, out: Path | None,
           say: Say, model: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    """Stall per kind of event against the baseline; writes the files under ``out`` if given.
    ``model`` describes what the workers trained (it goes into the JSON). Returns the result
    and its markdown table."""
    base = baseline(rows)
    if not base.stalls:
        raise CtlUsageError("no step ran under an unchanged policy: nothing to compare with")
    result: dict[str, Any] = {
        "model": model or {}, "typical_update_ms": base.typical,
        "optimizer_ms": summarize(base.optimizer) if base.optimizer else None,
        "baseline": {"steps": len(base.stalls), **summarize(base.stalls),
                     "framework": summarize(base.framework)},
        "kinds": {}}
    b = result["baseline"]
    lines = ["| event | events | measured | stall p50 ms | of it Chaos p50 ms | stall p99 ms | "
             "of it Chaos p99 ms | stall max ms | step excess p50 ms | step excess p99 ms |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
             f"| (no change) | {len(base.stalls)} | {len(base.stalls)} | {b['p50_ms']} | "
             f"{b['framework']['p50_ms']} | {b['p99_ms']} | {b['framework']['p99_ms']} | "
             f"{b['max_ms']} | - | - |"]
    samples: dict[str, list[float]] = {"baseline": base.stalls}
    per_event: list[dict[str, Any]] = []
    for kind in KINDS:
        evs = [e for e in events if e.get("kind") == kind and not e.get("bootstrap")]
        charged = [(e, event_cost(e, rows, base.typical)) for e in evs]
        costs = [c for _, c in charged if c is not None]
        if not costs:
            continue
        per_event += [{"seq": e.get("seq"), "kind": kind, "node": e.get("node"),
                       "peer": e.get("peer"), "policy_version": e.get("policy_version"),
                       "stall_ms": None if c is None else round(c[0], 3),
                       "step_excess_ms": None if c is None else round(c[1], 3),
                       "framework_ms": None if c is None else round(c[2], 3)}
                      for e, c in charged]
        stalls = [c[0] for c in costs]
        samples[kind] = stalls
        k: dict[str, Any] = {"events": len(evs), "measured": len(costs),
                             "stall": summarize(stalls),
                             "step_excess": summarize([c[1] for c in costs]),
                             "framework": summarize([c[2] for c in costs])}
        result["kinds"][kind] = k
        lines.append(f"| {kind} | {len(evs)} | {len(costs)} | {k['stall']['p50_ms']} | "
                     f"{k['framework']['p50_ms']} | {k['stall']['p99_ms']} | "
                     f"{k['framework']['p99_ms']} | {k['stall']['max_ms']} | "
                     f"{k['step_excess']['p50_ms']} | {k['step_excess']['p99_ms']} |")
    table = "\n".join(lines)
    opt = result["optimizer_ms"]
    if opt is not None:
        name = (model or {}).get("name", "the model")
        table += (f"\n\n{name}: the optimizer step (part of every stall above) took "
                  f"{opt['p50_ms']} ms at p50 and {opt['p99_ms']} ms at p99 per node.")
    if out is not None:
        output = Output(out, say)
        output.json("stall.json", {**result, "events": per_event, "samples": samples})
        output.text("stall.md", table)
        output.figure("stall.png", lambda plt: draw(plt, samples), dpi=120)
    return result, table


def draw(plt: Any, samples: dict[str, list[float]]) -> Any:
    """CDF of the stalls per kind."""
    fig, ax = plt.subplots(figsize=(7, 4))
    for name, values in samples.items():
        xs = sorted(values)
        ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post",
                label=f"{name} (n={len(xs)})")
    ax.axvline(1.0, color="grey", linestyle=":", label="1 ms (paper, Table I)")
    ax.set_xscale("log")
    ax.set_xlabel("stall of the step, ms (max over the nodes)")
    ax.set_ylabel("fraction of events")
    ax.legend(fontsize=8)
    return fig


def run(nodes: int, events: int, gap: float, out: Path | None, keep: Path | None,
        source: Path | None, say: Say, digest_every: int | None = None, model: str = "mlp"
        ) -> tuple[dict[str, Any], str]:
    """Run the cluster (or read what a ``keep`` run left in ``source``) and report.

    Raises:
        CtlUsageError: ``source`` is not a directory that a ``keep`` run wrote.
    """
    log: list[dict[str, Any]] = []
    if source is not None:
        if not (source / "events.json").exists():
            raise CtlUsageError(f"{source}/events.json is missing: not a directory that --keep "
                                "wrote")
        log = json.loads((source / "events.json").read_text())
        rows = {p.stem: records(p) for p in sorted(source.glob("*.jsonl"))}
        kept = source / "model.json"  # runs kept before there was a choice trained the mlp
        desc = json.loads(kept.read_text()) if kept.exists() else {"name": "mlp"}
    else:
        desc = describe(model)
        say(f"model {model}: {desc['parameters']:,} parameters, {desc['state_mb']} MB of state")
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "model.json").write_text(json.dumps(desc))
            try:
                log, rows = run_cluster(nodes, events, gap, Path(tmp), say, digest_every, model)
                (Path(tmp) / "events.json").write_text(json.dumps(log))
            finally:  # the logs matter most when the run failed
                if keep is not None:
                    keep_copy(Path(tmp), keep, say, "the records")
    return report(log, rows, out, say, desc)
