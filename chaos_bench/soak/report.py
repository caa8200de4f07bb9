"""The soak test's verdict: invariants over the step records, growth fits, table, JSON, PNG.

Invariants over the workers' records (:mod:`chaos_bench.soak.run`); an *epoch* is the time
between two power cuts of every box, and a *segment* one process between two joins:

- *state mismatch*: two rows of one step of one epoch with different digests. The last row
  of a segment is left out: a member dropped mid-round may have applied a result that the
  others then reran without it; it is re-replicated at once (its next segment), so that row is
  an abandoned branch, counted as ``abandoned`` and not a fault;
- *doubled or lost steps*: inside a segment each row's step is the previous one plus one;
  and every step between an epoch's first and last was committed by some node, but those up
  to a newer snapshot that a box brought back a moment after the restore (``newer_snapshots``:
  the cluster goes on from it, and the steps trained past the older one are redone);
- *state invented*: a process starts (its ``start`` row) with a state of step > 0 that no
  member ever committed: a replica or a snapshot must be one the cluster agreed on;
- *state went back*: once a step is committed, no member commits an older one (a rollback,
  or a reset to an older state or a fresh model); only a power cut may cost steps, and
- *state lost in a power cut*: at most one snapshot interval (the larger of ``every_steps``
  and the steps of the last ``every_s``), plus the tenth of ``every_steps`` a snapshot is
  aligned to and the steps of the time to write one, and *slow resume*: training again within
  ``resume_s`` of the daemons' return; *never resumed* if it did not;
- *loss jumped*: a segment starting after step 100 begins with a median loss nearer the
  fresh model's than the cluster's just before (a reset that renumbered its steps);
- *training stalled*: no node committed a step for ``stall_s`` during the chaos phase, a
  power cut's outage left out.

Stalls and slow resumes depend on timing (``TIMING``); the others are faults on any box.

Growth per hour: per process kind and metric, one least-squares slope shared by all the
processes of that kind, each with an intercept of its own (so a restart is not a drop),
over the samples after the warm-up of the run and, for each process, after its own
first ``min(warm-up, 30 s)``.
"""

from __future__ import annotations

import gzip
import itertools
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_bench.workers import records

METRICS = {"rss": ("RSS MiB", 1 / (1 << 20)), "fds": ("fds", 1.0), "threads": ("threads", 1.0)}
PROC_KINDS = ("chaosd", "worker", "broker")
PROC_WARMUP_S = 30.0  # the most a process of its own is left out after it starts
#: A process this old has settled: its allocator and caches have grown to their working size.
#: Every chaosd and worker of a soak is restarted within minutes (kills, power cuts), so the
#: fit over all of them is mostly warm-up; the settled fit is the one a leak shows in.
SETTLED_S = 300.0


def load_records(directory: Path) -> dict[str, list[list[dict[str, Any]]]]:
    """Each node's segments (a process between two joins), in the order they started. A
    process's ``start`` row (the state it held once its Trainer was built) opens its first
    segment; if the process joined again before its first commit (held, then sent a
    replica: the hour at 10fa179), the start row is a segment of its own. Reads the
    ``.jsonl`` files a run writes and the ``.jsonl.gz`` copies it keeps."""
    procs: dict[str, list[list[dict[str, Any]]]] = {}
    paths = sorted([*directory.glob("*.jsonl"), *directory.glob("*.jsonl.gz")])
    for path in paths:
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


@dataclass(frozen=True)
class Limits:
    """The bounds the invariants hold the run to (the defaults are the documented goals)."""

    stall_s: float = 60.0  # no step committed for this long, outside a power cut
    resume_s: float = 30.0  # training again this long after the daemons return
    every_steps: int = 100  # the snapshot interval (chaosd's [snapshots] defaults) ...
    every_s: float = 10.0
    write_s: float = 1.0  # ... and how long a snapshot of the soak's tiny state may take


# Violations that depend on timing (a loaded box can break them); every other kind is a
# correctness fault wherever it runs.
TIMING = ("training stalled", "slow resume")


class Checker:
    """The invariants over one run's step records; each method adds its violations."""

    def __init__(self, recs: dict[str, list[list[dict[str, Any]]]], window: tuple[float, float],
                 limits: Limits, outages: Sequence[tuple[float, float]]) -> None:
        self.recs, self.window, self.limits = recs, window, limits
        self.outages = sorted(outages)  # (power cut, power back), wall clock
        self.violations: list[str] = []
        self.rows = sorted(((node, r) for node, segs in recs.items() for seg in segs for r in seg
                            if not r.get("start")), key=lambda nr: nr[1]["t"])
        # (epoch, step) -> digests committed; an epoch is the time between two power cuts,
        # since steps lost in a cut are committed again after it with other data.
        self.digests: dict[tuple[int, int], set[str]] = {}
        self.tails: list[dict[str, Any]] = []
        self.restores: list[dict[str, Any]] = []

    def epoch(self, t: float) -> int:
        return sum(cut <= t for cut, _ in self.outages)

    def segments(self) -> None:
        """Inside a segment each step is the previous one plus one."""
        for node, segs in self.recs.items():
            for seg in segs:
                steps = [r for r in seg if not r.get("start")]
                for prev, row in itertools.pairwise(seg):
                    if row["step"] <= prev["step"]:
                        self.violations.append(f"doubled step: {node} committed step "
                                               f"{row['step']} after step {prev['step']}")
                    elif row["step"] > prev["step"] + 1:
                        self.violations.append(f"lost steps: {node} went from step "
                                               f"{prev['step']} to {row['step']} without a "
                                               "rejoin")
                for row in steps[:-1]:
                    key = (self.epoch(row["t"]), row["step"])
                    self.digests.setdefault(key, set()).add(row["digest"])
                if steps:
                    self.tails.append(steps[-1])

    def mismatches(self) -> int:
        """Two members never commit one step of one epoch with different states. The last
        row of a segment is left out: a member dropped mid-round may have applied a result
        the others then reran without it (an abandoned branch, counted, not a fault)."""
        by_step: dict[int, int] = {}
        for (_, step), ds in self.digests.items():
            by_step[step] = max(by_step.get(step, 0), len(ds))
        for first, last in _runs(sorted(s for s, n in by_step.items() if n > 1)):
            n = max(by_step.get(s, 0) for s in range(first, last + 1))
            where = f"step {first}" if first == last else f"steps {first}..{last}"
            self.violations.append(f"state mismatch at {where}: up to {n} digests per step")
        abandoned = 0
        for row in self.tails:
            known = self.digests.setdefault((self.epoch(row["t"]), row["step"]), {row["digest"]})
            abandoned += row["digest"] not in known
        return abandoned

    def starts(self) -> None:
        """A process starts with a state some member committed (a replica or a snapshot),
        or with a fresh model only when nothing was ever committed."""
        committed: dict[int, set[str]] = {}
        for (_, step), ds in self.digests.items():
            committed.setdefault(step, set()).update(ds)
        for node, segs in self.recs.items():
            for seg in segs:
                row = seg[0]
                if not row.get("start") or row["step"] == 0:
                    continue
                if row["digest"] not in committed.get(row["step"], set()):
                    self.violations.append(f"state invented: {node} started at step "
                                           f"{row['step']} with a state no member committed")

    def jumps(self) -> list[dict[str, Any]]:
        """After a power cut, processes that started from a state committed before it and
        newer than the epoch's first restore: a box back a moment later with a newer snapshot
        on its disk, which the cluster then went on from (the hour at b3c896e: restored at
        21000, then n3's 21010). The steps up to it are not lost; the ones the epoch had
        trained past the older snapshot are redone (``discarded``)."""
        out: list[dict[str, Any]] = []
        for node, segs in self.recs.items():
            for seg in segs:
                row = seg[0]
                e = self.epoch(row["t"])
                if not row.get("start") or e == 0:
                    continue
                before = any(row["digest"] in self.digests.get((old, row["step"]), ())
                             for old in range(e))
                mine = {r["step"] for _, r in self.rows
                        if self.epoch(r["t"]) == e and r["step"] < row["step"]}
                if before and mine:
                    out.append({"epoch": e, "node": node, "step": row["step"],
                                "t": round(row["t"] - self.window[0], 2),
                                "discarded": len(mine)})
        return sorted(out, key=lambda j: j["t"])

    def regressions(self) -> None:
        """State loss and rollback: once a step is committed, no member commits an older
        step again (a reset to an older state or to a fresh model), but after a power cut of
        every box, which may cost one snapshot interval and no more."""
        top = 0  # the newest step committed so far in this epoch
        epoch = 0
        told: set[tuple[str, int]] = set()
        history: list[tuple[float, int]] = []  # (t, step) of this epoch's commits
        seen: dict[tuple[int, int], set[str]] = {}  # digests committed so far, per step
        for node, row in self.rows:
            e = self.epoch(row["t"])
            if e != epoch:
                self._restore(epoch, e, history, top, row)
                epoch, top, history = e, row["step"], []
            elif row["step"] < top and (node, e) not in told and \
                    row["digest"] not in seen.get((e, row["step"]), ()):
                # (A row of the step's agreed state written late is no rollback: a worker
                # frozen between its commit and its write, the soak's hour at 98ac52f.)
                told.add((node, e))
                what = "a fresh model" if row["step"] == 1 else f"step {row['step']}"
                self.violations.append(f"state went back: {node} committed {what} at "
                                       f"t={row['t'] - self.window[0]:.1f}s after step {top} "
                                       "was committed")
            top = max(top, row["step"])
            history.append((row["t"], row["step"]))
            seen.setdefault((e, row["step"]), set()).add(row["digest"])

    def _restore(self, old: int, new: int, history: list[tuple[float, int]], top: int,
                 row: dict[str, Any]) -> None:
        cut, back = self.outages[new - 1]
        lim = self.limits
        restored = row["step"] - 1
        # The newest snapshot due before the cut: one interval (both its steps and its
        # seconds passed), the steps to the next multiple it is taken at, and the time to
        # write it (chaos_edge.trainer.snapshots).
        recent = {s for t, s in history if t >= cut - lim.every_s}
        in_write = {s for t, s in history if t >= cut - lim.write_s}
        align = max(1, lim.every_steps // 10)
        allowed = max(lim.every_steps, len(recent)) + align + len(in_write)
        lost = top - restored
        resumed = row["t"] - back
        self.restores.append({"cut_t": round(cut - self.window[0], 2), "back_s":
                              round(back - cut, 2), "top": top, "restored": restored,
                              "lost": lost, "allowed": allowed,
                              "resumed_s": round(resumed, 2)})
        if new != old + 1:
            self.violations.append(f"no step between two power cuts (epoch {old} to {new})")
        if lost > allowed:
            what = "a fresh model" if restored == 0 else f"step {restored}"
            self.violations.append(f"state lost in a power cut: resumed from {what} after "
                                   f"step {top}, {lost} steps lost (one interval: {allowed})")
        if resumed > lim.resume_s:
            self.violations.append(f"slow resume: training again {resumed:.0f} s after the "
                                   "daemons returned")

    def loss_continuity(self) -> None:
        """A segment starting late in the run trains on a trained model: its first losses
        stay near the cluster's recent ones, not the fresh model's."""
        early = sorted(r.get("loss", 0.0) for _, r in self.rows[:40] if r["step"] <= 10)
        if len(early) < 5:
            return
        fresh = early[len(early) // 2]
        for node, segs in self.recs.items():
            for seg in segs:
                rows = [r for r in seg if not r.get("start") and "loss" in r]
                if len(rows) < 5 or rows[0]["step"] <= 100:
                    continue
                t0 = rows[0]["t"]
                before = sorted(r["loss"] for _, r in self.rows
                                if t0 - 30.0 <= r["t"] < t0 and "loss" in r)
                if len(before) < 10:
                    continue
                prev = before[len(before) // 2]
                first = sorted(r["loss"] for r in rows[:10])[len(rows[:10]) // 2]
                if prev < fresh / 4 and first > (fresh + prev) / 2:
                    self.violations.append(
                        f"loss jumped: {node} resumed at step {rows[0]['step']} with loss "
                        f"{first:.3g} (cluster {prev:.3g} before, fresh model {fresh:.3g})")

    def stalls(self) -> float:
        """The longest time without a committed step, a power cut's own outage left out
        (its resume is held to ``resume_s`` instead)."""
        lo, hi = self.window
        times = sorted({r["t"] for _, r in self.rows if lo <= r["t"] <= hi} |
                       {lo, hi} | {t for o in self.outages for t in o if lo <= t <= hi})
        gaps = [(a, b - a) for a, b in itertools.pairwise(times)
                if not any(cut <= a and b <= back for cut, back in self.outages)]
        for at, gap in gaps:  # each one: an hour once had three of about 100-300 s
            if gap > self.limits.stall_s:
                self.violations.append(f"training stalled: no step for {gap:.0f} s from "
                                       f"t={at - lo:.0f}s")
        return max((gap for _, gap in gaps), default=0.0)


def before(recs: dict[str, list[list[dict[str, Any]]]], until: float | None
           ) -> dict[str, list[list[dict[str, Any]]]]:
    """The rows written before the teardown began (all of them for ``None``).

    Stopping, each chaosd asks its worker to leave, and the worker drains rounds with no
    samples until a policy without it comes, which with every daemon going never does: steps
    the script never sees, so it records none. A joiner that finished its pull then started
    from one of them. Counted, those read as steps committed by no node and a state invented
    (the CI soak in stop 51: 850..934 drained, a joiner started at 934 from one).
    """
    if until is None:
        return recs
    out: dict[str, list[list[dict[str, Any]]]] = {}
    for node, segs in recs.items():
        kept = [[r for r in seg if r["t"] < until] for seg in segs]
        out[node] = [seg for seg in kept if seg]
    return out


def check(recs: dict[str, list[list[dict[str, Any]]]], window: tuple[float, float],
          limits: Limits | None = None,
          outages: Sequence[tuple[float, float]] = ()) -> tuple[list[str], dict[str, Any]]:
    """The violations, and a summary of the steps."""
    c = Checker(recs, window, limits or Limits(), outages)
    c.segments()
    abandoned = c.mismatches()
    steps = sorted({s for _, s in c.digests})
    if not steps:
        return [*c.violations, "no step was committed"], {"steps": 0}
    jumps = c.jumps()
    for e in range(len(c.outages) + 1):
        mine = sorted(s for ep, s in c.digests if ep == e)
        # Steps up to a newer snapshot the epoch went on from were committed before the cut.
        skipped = max((j["step"] for j in jumps if j["epoch"] == e), default=0)
        lost = [s for s in range(mine[0], mine[-1] + 1)
                if (e, s) not in c.digests and s > skipped] if mine else []
        if lost:
            c.violations.append(f"lost steps: {len(lost)} steps committed by no node, "
                                f"first {lost[0]}")
    c.starts()
    c.regressions()
    c.loss_continuity()
    longest = c.stalls()
    for cut, _ in c.outages[len(c.restores):]:
        c.violations.append(f"never resumed after the power cut at t={cut - window[0]:.0f}s")
    summary = {"first_step": steps[0], "last_step": steps[-1], "steps": len(steps),
               "segments": sum(len(s) for s in recs.values()), "abandoned": abandoned,
               "longest_gap_s": round(longest, 2), "power_cuts": c.restores,
               "newer_snapshots": jumps,
               "rows": len(c.rows)}
    return c.violations, summary


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
        settled = [s for s in used if s["age"] >= SETTLED_S]
        row: dict[str, Any] = {"processes": len({s["pid"] for s in mine}),
                               "samples": len(used),
                               "settled_processes": len({s["pid"] for s in settled})}
        for metric, (_, scale) in METRICS.items():
            values = sorted(s[metric] * scale for s in used)
            row[metric] = round(values[len(values) // 2], 2) if values else None
            for key, these in ((f"{metric}_per_h", used), (f"{metric}_per_h_settled", settled)):
                per_s = slope(these, metric)
                row[key] = None if per_s is None else round(per_s * 3600 * scale, 3)
        out[kind] = row
    return out


def analyse(records: dict[str, list[list[dict[str, Any]]]], samples: list[dict[str, Any]],
            warmup_s: float, window: tuple[float, float], limits: Limits,
            outages: Sequence[tuple[float, float]] = (), until: float | None = None
            ) -> dict[str, Any]:
    """The report document (without the run's options and timeline); ``until``: when the
    teardown began (see :func:`before`)."""
    violations, steps = check(before(records, until), window, limits, outages)
    return {"violations": violations, "steps": steps, "growth": growth(samples, warmup_s),
            "samples": samples}


def recheck(directory: Path) -> dict[str, Any]:
    """The verdict of today's checker on a committed run (``soak.json`` and ``records/``
    under ``directory``), written to ``recheck.json`` beside them.

    Raises:
        FileNotFoundError: ``directory`` holds no ``soak.json``.
        ValueError: Its ``soak.json`` says neither its window nor where it began.
    """
    doc = json.loads((directory / "soak.json").read_text())
    if "window" in doc:
        lo, hi = doc["window"]
    else:  # runs before the window was kept: an earlier recheck estimated where it began
        older = directory / "recheck.json"
        if not older.exists():
            raise ValueError(f"{directory / 'soak.json'} has no window to check again")
        lo = json.loads(older.read_text())["t0_wall_estimated"]
        hi = lo + doc["options"]["minutes"] * 60
    outages = [(lo + a, lo + b) for a, b in doc.get("outages", [])]
    limits = Limits(**doc["options"].get("limits", {}))
    violations, steps = check(before(load_records(directory / "records"), doc.get("teardown")),
                              (lo, hi), limits, outages)
    out = {"t0_wall_estimated": lo, "violations": violations, **steps}
    (directory / "recheck.json").write_text(json.dumps(out, indent=1) + "\n")
    return out


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
                "threads/h", f"settled (>= {SETTLED_S:g} s): procs", "RSS MiB/h"):
        t.add_column(col, justify="right")

    def rate(g: dict[str, Any], key: str) -> str:
        return "-" if g.get(key) is None else f"{g[key]:+.2f}"

    for kind, g in doc["growth"].items():
        cells = [str(g["processes"]), str(g["samples"])]
        for metric in METRICS:
            cells += ["-" if g[metric] is None else f"{g[metric]:g}", rate(g, f"{metric}_per_h")]
        cells += [str(g.get("settled_processes", "-")), rate(g, "rss_per_h_settled")]
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
    for cut in st.get("power_cuts", []):
        lines.append(f"power cut at t={cut['cut_t']:g}s for {cut['back_s']:g}s: step "
                     f"{cut['top']} -> {cut['restored']} ({cut['lost']} lost, one interval "
                     f"{cut['allowed']}), training again {cut['resumed_s']:g}s after return")
    viol = doc["violations"]
    lines.append(f"invariant violations: {len(viol)}" + "".join(f"\n  {v}" for v in viol))
    return "\n".join(lines)


def keep_records(records_dir: Path, dest: Path, say: Say) -> None:
    """The workers' step records, gzipped, beside the results (:func:`load_records` reads
    them back, so a verdict can be checked again from what was committed)."""
    dest.mkdir(parents=True, exist_ok=True)
    total = 0
    for path in sorted(records_dir.glob("*.jsonl")):
        data = gzip.compress(path.read_bytes(), mtime=0)
        (dest / f"{path.name}.gz").write_bytes(data)
        total += len(data)
    say(f"kept the step records in {dest} ({total / 1e6:.1f} MB gzipped)")


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
