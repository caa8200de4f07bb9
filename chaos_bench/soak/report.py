"""The soak test's verdict: invariants over the step records, growth fits, table, JSON, PNG.

Invariants over the workers' records (:mod:`chaos_bench.soak.run`):

- *state mismatch*: two rows of the same step with different digests. The last row of a
  *segment* (one process between two joins) is left out: a member dropped mid-round may have
  applied a result that the others then reran without it; it is re-replicated at once (its
  next segment), so that row is an abandoned branch, counted as ``abandoned`` and not a fault;
- *doubled or lost steps*: inside a segment each row's step is the previous one plus one;
  and every step between the cluster's first and last was committed by some node;
- *stall*: no node committed a step for ``stall_limit_s`` during the chaos phase.

Growth per hour: per process kind and metric, one least-squares slope shared by all the
processes of that kind, each with an intercept of its own (so a restart is not a drop),
over the samples after the warm-up of the run and, for each process, after its own
first ``min(warm-up, 30 s)``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from rich.table import Table

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_bench.workers import records

METRICS = {"rss": ("RSS MiB", 1 / (1 << 20)), "fds": ("fds", 1.0), "threads": ("threads", 1.0)}
PROC_KINDS = ("chaosd", "worker", "broker")
PROC_WARMUP_S = 30.0  # the most a process of its own is left out after it starts


def load_records(directory: Path) -> dict[str, list[list[dict[str, Any]]]]:
    """Each node's segments (a process between two joins), in the order they started."""
    procs: dict[str, list[list[dict[str, Any]]]] = {}
    for path in sorted(directory.glob("*.jsonl")):
        node = path.name.split(".")[0]
        segments: list[list[dict[str, Any]]] = []
        for row in records(path):
            if not segments or segments[-1][-1].get("joins") != row.get("joins"):
                segments.append([])
            segments[-1].append(row)
        procs.setdefault(node, []).extend(segments)
    for segments in procs.values():
        segments.sort(key=lambda seg: seg[0]["t"])
    return procs


def check(records: dict[str, list[list[dict[str, Any]]]], window: tuple[float, float],
          stall_limit_s: float) -> tuple[list[str], dict[str, Any]]:
    """The violations, and a summary of the steps."""
    violations: list[str] = []
    digests: dict[int, set[str]] = {}
    tails: list[dict[str, Any]] = []
    for node, segments in records.items():
        for seg in segments:
            for prev, row in itertools.pairwise(seg):
                if row["step"] <= prev["step"]:
                    violations.append(f"doubled step: {node} committed step {row['step']} "
                                      f"after step {prev['step']}")
                elif row["step"] > prev["step"] + 1:
                    violations.append(f"lost steps: {node} went from step {prev['step']} to "
                                      f"{row['step']} without a rejoin")
            for row in seg[:-1]:
                digests.setdefault(row["step"], set()).add(row["digest"])
            tails.append(seg[-1])
    bad = [step for step, ds in sorted(digests.items()) if len(ds) > 1]
    for first, last in _runs(bad):  # one line per run of steps (a split brain is hundreds)
        n = max(len(digests[s]) for s in range(first, last + 1))
        where = f"step {first}" if first == last else f"steps {first}..{last}"
        violations.append(f"state mismatch at {where}: up to {n} digests per step")
    abandoned = 0
    for row in tails:
        known = digests.setdefault(row["step"], {row["digest"]})
        abandoned += row["digest"] not in known
    steps = sorted(digests)
    if not steps:
        return [*violations, "no step was committed"], {"steps": 0}
    lost = [s for s in range(steps[0], steps[-1] + 1) if s not in digests]
    if lost:
        violations.append(f"lost steps: {len(lost)} steps committed by no node, first {lost[0]}")
    times = sorted(r["t"] for segs in records.values() for seg in segs for r in seg
                   if window[0] <= r["t"] <= window[1])
    gaps = [b - a for a, b in itertools.pairwise([window[0], *times, window[1]])]
    if max(gaps) > stall_limit_s:
        violations.append(f"training stalled: no step for {max(gaps):.0f} s")
    summary = {"first_step": steps[0], "last_step": steps[-1], "steps": len(steps),
               "segments": sum(len(s) for s in records.values()), "abandoned": abandoned,
               "longest_gap_s": round(max(gaps), 2),
               "rows": sum(len(seg) for segs in records.values() for seg in segs)}
    return violations, summary


def _runs(steps: list[int]) -> list[tuple[int, int]]:
    """Sorted steps as runs of consecutive steps: [1, 2, 3, 7] -> [(1, 3), (7, 7)]."""
    runs: list[tuple[int, int]] = []
    for s in steps:
        if runs and runs[-1][1] == s - 1:
            runs[-1] = (runs[-1][0], s)
        else:
            runs.append((s, s))
    return runs


def slope(samples: list[dict[str, Any]], metric: str) -> float | None:
    """Least-squares growth per second shared by the processes, each with its own level."""
    by_pid: dict[int, list[tuple[float, float]]] = {}
    for s in samples:
        by_pid.setdefault(s["pid"], []).append((s["t"], float(s[metric])))
    num = den = 0.0
    for points in by_pid.values():
        if len(points) < 3:
            continue
        mt = sum(t for t, _ in points) / len(points)
        my = sum(y for _, y in points) / len(points)
        num += sum((t - mt) * (y - my) for t, y in points)
        den += sum((t - mt) ** 2 for t, _ in points)
    return num / den if den > 0 else None


def growth(samples: list[dict[str, Any]], warmup_s: float) -> dict[str, dict[str, Any]]:
    """Per process kind: processes, samples, median level and growth per hour of each metric."""
    out: dict[str, dict[str, Any]] = {}
    for kind in PROC_KINDS:
        mine = [s for s in samples if s["kind"] == kind]
        # A process restarted late (the broker, often) gets a shorter warm-up of its own.
        used = [s for s in mine
                if s["t"] >= warmup_s and s["age"] >= min(warmup_s, PROC_WARMUP_S)]
        row: dict[str, Any] = {"processes": len({s["pid"] for s in mine}),
                               "samples": len(used)}
        for metric, (_, scale) in METRICS.items():
            values = sorted(s[metric] * scale for s in used)
            row[metric] = round(values[len(values) // 2], 2) if values else None
            per_s = slope(used, metric)
            row[f"{metric}_per_h"] = None if per_s is None else round(per_s * 3600 * scale, 3)
        out[kind] = row
    return out


def analyse(records: dict[str, list[list[dict[str, Any]]]], samples: list[dict[str, Any]],
            warmup_s: float, stall_limit_s: float,
            window: tuple[float, float]) -> dict[str, Any]:
    """The report document (without the run's options and timeline)."""
    violations, steps = check(records, window, stall_limit_s)
    return {"violations": violations, "steps": steps, "growth": growth(samples, warmup_s),
            "samples": samples}


def table(doc: dict[str, Any]) -> Table:
    """Growth per hour per process kind (rich)."""
    o = doc["options"]
    t = Table(title="Soak: resources per process kind, growth per hour",
              caption=f"{o['minutes']:g} min, {o['nodes']} nodes, "
                      f"{sum(not e['follow_up'] for e in doc['timeline'])} chaos events, "
                      f"{doc['steps'].get('steps', 0)} steps; fits after a "
                      f"{o['warmup_s']:g} s warm-up; levels are medians")
    t.add_column("process", justify="left")
    for col in ("procs", "samples", "RSS MiB", "RSS MiB/h", "fds", "fds/h", "threads",
                "threads/h"):
        t.add_column(col, justify="right")
    for kind, g in doc["growth"].items():
        cells = [str(g["processes"]), str(g["samples"])]
        for metric in METRICS:
            cells += ["-" if g[metric] is None else f"{g[metric]:g}",
                      "-" if g[f"{metric}_per_h"] is None else f"{g[f'{metric}_per_h']:+.2f}"]
        t.add_row(kind, *cells)
    return t


def counts(doc: dict[str, Any], follow_up: bool) -> str:
    """Chaos actions by kind: ``kill 3 (1 failed), ...``."""
    found: dict[str, list[int]] = {}
    for e in doc["timeline"]:
        if e["follow_up"] == follow_up:
            c = found.setdefault(e["kind"], [0, 0])
            c[0] += 1
            c[1] += not e["ok"]
    return ", ".join(f"{k} {n}" + (f" ({bad} failed)" if bad else "")
                     for k, (n, bad) in sorted(found.items())) or "none"


def summary(doc: dict[str, Any]) -> str:
    """The events, the steps and the verdict, as plain lines under the table."""
    st = doc["steps"]
    lines = [f"chaos events: {counts(doc, False)}",
             f"follow-ups: {counts(doc, True)}",
             f"steps {st.get('first_step', '-')}..{st.get('last_step', '-')} "
             f"({st.get('rows', 0)} rows in {st.get('segments', 0)} segments, "
             f"{st.get('abandoned', 0)} abandoned, longest gap {st.get('longest_gap_s', '-')} s)",
             f"leftovers after teardown: {len(doc['leftovers'])}"]
    viol = doc["violations"]
    lines.append(f"invariant violations: {len(viol)}" + "".join(f"\n  {v}" for v in viol))
    return "\n".join(lines)


def write(doc: dict[str, Any], out: Path, say: Say) -> None:
    """``soak.json`` and (with matplotlib) ``soak.png`` under ``out``."""
    output = Output(out, say)
    output.json("soak.json", doc)
    output.figure("soak.png", lambda plt: draw(plt, doc))


def draw(plt: Any, doc: dict[str, Any]) -> Any:
    """RSS, fds and threads of every process over the run, chaos actions marked."""
    colours = {"chaosd": "tab:blue", "worker": "tab:orange", "broker": "tab:green"}
    fig, axes = plt.subplots(len(METRICS), 1, figsize=(9, 8), sharex=True)
    for ax, (metric, (label, scale)) in zip(axes, METRICS.items(), strict=True):
        lines: dict[int, list[dict[str, Any]]] = {}
        for s in doc["samples"]:
            lines.setdefault(s["pid"], []).append(s)
        shown: set[str] = set()
        for points in lines.values():
            kind = points[0]["kind"]
            ax.plot([p["t"] / 60 for p in points], [p[metric] * scale for p in points],
                    color=colours[kind], linewidth=0.8,
                    label=None if kind in shown else kind)
            shown.add(kind)
        for e in doc["timeline"]:
            if not e["follow_up"]:
                ax.axvline(e["t"] / 60, color="grey", alpha=0.2, linewidth=0.6)
        ax.axvline(doc["options"]["warmup_s"] / 60, color="red", linestyle=":", linewidth=0.8)
        ax.set_ylabel(label)
    axes[0].legend(fontsize=8, loc="upper left")
    axes[-1].set_xlabel("minutes (grey: chaos events; red: end of warm-up)")
    return fig
