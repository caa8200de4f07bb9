"""``chaosctl bench dst``: many seeds on every core, or one seed with its trace.

A campaign runs seeds ``start .. start + seeds - 1``, each a simulated run of ``duration``
seconds, on ``jobs`` processes, and reports seeds per second, the coverage (every message,
request, command, report and fault kind, and how often it was hit), and every violation with
its seed. A failing seed is then replayed twice (it must give the same trace digest both
times, else the harness itself is broken) and its trace is written next to the results,
shrunk to the faults that matter.

Writes ``dst.json`` (the summary, the coverage, every violation) and ``dst.md`` to ``--out``,
and ``seed-N.txt`` (plan, shrunk plan and trace) for each failing seed shown.
"""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

from chaos_bench.dst.coverage import EXPECTED, merge, missing
from chaos_bench.dst.faults import EVERY_DRAW, FAST_PACE_S, Draws, make_plan
from chaos_bench.dst.run import Result, replay, run_many, run_plan, shrink
from chaos_bench.output import Output
from chaos_bench.progress import Say

SHOW = 5  # failing seeds whose trace is written (the first of each kind first)
SAY_EVERY_S = 15.0  # progress at least this often


def campaign(seeds: int, start: int, duration: float, jobs: int, out: Path,
             say: Say, mutant: str | None = None, draws: Draws = EVERY_DRAW) -> dict[str, Any]:
    """Run the seeds (with ``mutant``'s fault put back, if named; ``draws``: which later
    fault streams the plans draw); write and return the summary."""
    t0 = time.monotonic()
    done: list[dict[str, Any]] = []
    every = max(1, seeds // 20)
    said = [t0]  # when progress was last said

    def progress(doc: dict[str, Any]) -> None:
        done.append(doc)
        kinds = sorted({v["kind"] for v in doc.get("violations", [])})
        if kinds or "crash" in doc or "harness_error" in doc:  # at once: a long run's news
            what = ", ".join(kinds) or ("crash" if "crash" in doc else "harness error")
            say(f"seed {doc['seed']} fails: {what}")
        now = time.monotonic()
        if len(done) % every == 0 or len(done) == seeds or now - said[0] >= SAY_EVERY_S:
            said[0] = now
            bad = sum(1 for d in done if d.get("violations") or "crash" in d
                      or "harness_error" in d)
            say(f"{len(done)}/{seeds} seeds, {bad} failing, "
                f"{len(done) / max(time.monotonic() - t0, 1e-9):.1f} seeds/s")

    # Stopped early (Ctrl-C, or SIGTERM from a scheduler's time limit), the seeds that ran
    # are summarised all the same: a long campaign's hours are not thrown away.
    interrupted = False
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        run_many(range(start, start + seeds), duration, jobs, progress, mutant, draws)
    except KeyboardInterrupt:
        interrupted = True
        say(f"interrupted: summarising the {len(done)} seeds that ran")
    finally:
        signal.signal(signal.SIGTERM, previous)
    wall = time.monotonic() - t0
    seeds = len(done)
    cover = merge(d.get("coverage", {}) for d in done)
    by_kind: dict[str, list[int]] = {}
    for d in done:
        for v in d.get("violations", []):
            seeds_of = by_kind.setdefault(v["kind"], [])
            if d["seed"] not in seeds_of:
                seeds_of.append(d["seed"])
    crashes = [d for d in done if "crash" in d]
    harness = [d for d in done if "harness_error" in d]
    doc: dict[str, Any] = {
        "seeds": seeds, "start": start, "duration_s": duration, "jobs": jobs, "mutant": mutant,
        "policy_ops": draws.policy_ops,
        "slow": draws.slow,
        "slow_links": draws.slow_links,
        "interrupted": interrupted,
        "wall_s": round(wall, 2), "cpu_s_per_seed": round(
            sum(d.get("cpu_s", 0.0) for d in done) / max(len(done), 1), 4),
        "seeds_per_s": round(seeds / max(wall, 1e-9), 2),
        "simulated_s": round(seeds * duration),
        "events": sum(d.get("events", 0) for d in done),
        "fast_pace_seeds": sum(d.get("pace") == FAST_PACE_S for d in done),
        "failing_seeds": sorted({d["seed"] for d in done if d.get("violations")}),
        "violations_by_kind": {k: {"seeds": len(v), "first": v[:10]}
                               for k, v in sorted(by_kind.items())},
        "crashes": crashes, "harness_errors": harness,
        "coverage": dict(sorted(cover.items())),
        "coverage_expected": {k: cover.get(k, 0) for k in EXPECTED},
        "never_hit": missing(cover),
        "violations": [{"seed": d["seed"], **v} for d in done for v in d.get("violations", [])],
    }
    o = Output(out, say)
    o.json("dst.json", doc)
    o.text("dst.md", table(doc))
    shown = _show(doc, duration, o, say, mutant, draws)
    doc["shown"] = shown
    return doc


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _show(doc: dict[str, Any], duration: float, o: Output, say: Say,
          mutant: str | None, draws: Draws) -> list[int]:
    """Replay, shrink and write the trace of a few failing seeds (the first of each kind)."""
    picks: list[int] = []
    for info in doc["violations_by_kind"].values():
        for seed in info["first"][:1]:
            if seed not in picks:
                picks.append(seed)
    for seed in picks[:SHOW]:
        say(f"replaying seed {seed} twice, then shrinking it")
        text = describe(seed, duration, do_shrink=True, mutant=mutant, draws=draws)
        o.text(f"seed-{seed}.txt", text)
    return picks[:SHOW]


def describe(seed: int, duration: float, do_shrink: bool = False,
             mutant: str | None = None, draws: Draws = EVERY_DRAW) -> str:
    """A seed's plan, violations and trace (and its shrunk plan), for people.

    Raises:
        HarnessError: The seed does not replay identically.
    """
    res = replay(seed, duration, mutant, draws)  # twice, compared
    plan = make_plan(seed, duration, draws=draws)
    lines = [*plan.describe(), "", f"digest {res.digest}, {res.events} events, "
             f"frontier step {res.frontier}, {res.cpu_s:.2f} CPU-s"]
    lines += [f"VIOLATION {v.kind} at {v.at:.3f}s: {v.detail}" for v in res.violations]
    if do_shrink and res.violations:
        small = shrink(plan, {v.kind for v in res.violations}, mutant=mutant)
        lines += ["", f"shrunk to {len(small.faults)} of {len(plan.faults)} faults:",
                  *small.describe()[1:]]
        res = run_plan(small, trace=True, mutant=mutant)
        lines += [f"VIOLATION {v.kind} at {v.at:.3f}s: {v.detail}" for v in res.violations]
    lines += ["", "trace:", *res.trace]
    return "\n".join(lines)


def one(seed: int, duration: float, do_shrink: bool, say: Say,
        mutant: str | None = None, draws: Draws = EVERY_DRAW) -> Result:
    """Run one seed (twice: it must replay) and print its trace."""
    text = describe(seed, duration, do_shrink, mutant, draws)
    for line in text.splitlines():
        say(line)
    return run_plan(make_plan(seed, duration, draws=draws), mutant=mutant)


def table(doc: dict[str, Any]) -> str:
    """The campaign's summary, as markdown."""
    title = f"# Deterministic simulation: {doc['seeds']} seeds from {doc['start']}"
    if doc.get("mutant"):
        title += f", mutant {doc['mutant']}"
    if doc.get("policy_ops") is False:
        title += ", no policy ops"
    if doc.get("slow") is False:
        title += ", no slow boxes"
    if doc.get("slow_links") is False:
        title += ", no slow links"
    if doc.get("interrupted"):
        title += " (interrupted: the seeds that ran)"
    rows = [title, "",
            f"{doc['seeds']} seeds of {doc['duration_s']:g} simulated s on {doc['jobs']} "
            f"processes: {doc['wall_s']:.0f} s wall, {doc['seeds_per_s']:.1f} seeds/s, "
            f"{doc['cpu_s_per_seed'] * 1000:.0f} CPU-ms per seed, {doc['events']} events; "
            f"{doc.get('fast_pace_seeds', 0)} seeds stepped at the fast pace.", "",
            "| violation | seeds | first seeds |", "| --- | --- | --- |"]
    if not doc["violations_by_kind"]:
        rows.append("| none | 0 | - |")
    for kind, info in doc["violations_by_kind"].items():
        rows.append(f"| {kind} | {info['seeds']} | {', '.join(map(str, info['first']))} |")
    rows += ["", f"crashes: {len(doc['crashes'])}, harness errors: "
             f"{len(doc['harness_errors'])}", "", "| covered | hits |", "| --- | --- |"]
    rows += [f"| {k} | {n} |" for k, n in doc["coverage_expected"].items()]
    rows += ["", f"never hit: {', '.join(doc['never_hit']) or 'nothing'}"]
    return "\n".join(rows)


def default_jobs() -> int:
    return max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
               else (os.cpu_count() or 1))


