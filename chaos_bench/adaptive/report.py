"""The adaptive bench's analysis: one row per run, a summary per policy over the seeds, the
controller's switches with its predictions checked, the goals, the timeline plot.

Per run (times are seconds since the schedule began; the eval node's step log):

- ``to_target_s``: the time of the first saved snapshot whose validation loss is at or below
  the target (None: not within the schedule). Snapshots are a few seconds apart, so this is
  late by up to that much, alike for every policy. The summary also gives the time to every
  loss level 0.1 apart that some run reached (``to_levels_s``): the whole curve, since one
  target set before the runs may fall where every policy is alike.
- ``final_val_loss``: the validation loss of the parameters saved when the schedule ended.
- ``phase_steps_per_s``: steps per second within each phase. A step of DiLoCo is not worth
  a step of every-step sync (its members drift between rounds), so this is speed, not
  progress; the loss columns say what the steps bought.
- ``phase_samples_per_s``: the steps every node committed within each phase, a second: the
  samples, in member batches. A member set aside as a straggler commits none, so a step
  without it is two thirds of the work; the per-phase goal is judged on this.
- ``stragglers`` (adaptive runs): each ``straggler`` event (set aside, its gain measured, let
  back in), with the gains predicted and measured.
- ``switches`` (adaptive runs): each ``policy-changed`` event with the step time the model
  predicted for the new policy and the step time measured under it: the eval node's wall
  time per step from the step the new policy took over at to the next switch or the next
  phase (whichever comes first: the prediction was for the links and compute of its phase),
  when that window holds at least ``MIN_WINDOW`` steps and two of the new policy's rounds.
  A change of the members (a straggler set aside or back) also ends it: the prediction was
  for the members of its moment (stop 60: two switches 6 and 9 steps before a set-aside
  were "measured" at 3-4x faster than predicted, without the straggler they had counted).
  A change decided after the switch that lands before it leaves nothing to check
  (``members_changed_first``; stop 61's seed 15: +439 %).
  A policy takes over at its effective step, or, leaving DiLoCo, at the first outer round
  at or after it (``takes_over_at``): a DiLoCo round is never cut short, so the switch
  lands up to H steps after the step the event names.

Goals (issue 24), on the seeds' means: the adaptive run reaches the target first; its time
to the target is within 10 % of the best fixed policy's (of those that reached it in every
seed), which is the verdict for a phase measured alone (``--phases`` with one phase: the
issue's "within 10 % of the best fixed policy in each phase measured alone"); and in each
phase of the schedule its samples a second are within 10 % of the best fixed policy's. The
final validation losses are set side by side, with no verdict: 10 % of a loss is no bound.
The model's check: the median absolute error of the predicted step time, goal 20 %.
"""

from __future__ import annotations

import statistics
from bisect import bisect_left
from pathlib import Path
from typing import Any

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_bench.stats import spread
from chaos_edge.trainer.rhythm import Rhythm
from daemon.contracts.policy import SyncMode

ADAPTIVE = "adaptive"
MIN_WINDOW = 10
PHASE_SLACK = 0.10
PREDICTION_GOAL = 0.20


def _eval_node(run: dict[str, Any]) -> dict[str, Any]:
    return run["nodes"][min(run["nodes"])]  # n1 evaluates: the bench names it first


def _rate(steps: list[list[float]], t0: float, t1: float) -> float | None:
    inside = [s for s, t in steps if t0 <= t < t1]
    return len(inside) / (t1 - t0) if t1 > t0 and steps else None


def _samples_rate(run: dict[str, Any], t0: float, t1: float) -> float | None:
    """Steps every node committed in [t0, t1), a second: samples in member batches."""
    rates = [r for node in run["nodes"].values()
             if (r := _rate(node["steps"], t0, t1)) is not None]
    return sum(rates) if rates else None


def _stragglers(run: dict[str, Any], switches: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The judge's events, each set-aside with its model check: the step time predicted
    without the member against the one a remaining node measured, from the step the
    set-aside took effect at to the next switch, the rejoin or the phase's end."""
    events = sorted(run["events"], key=lambda e: e.get("seq", 0))
    lands = sorted(int(s["takes_over_at"]) for s in switches)
    out = []
    for e in events:
        if e.get("kind") != "straggler":
            continue
        row = {k: e.get(k) for k in ("t", "action", "node", "cause", "predicted_gain",
                                     "measured_gain", "predicted_step_ms_without",
                                     "policy_switched")}
        row["measured_step_ms"] = row["error"] = None
        if e.get("action") == "set-aside":
            scale_in = next((x for x in reversed(events) if x.get("kind") == "scale-in"
                             and x.get("reason") == "straggler" and x.get("node") == e["node"]
                             and x.get("seq", 0) < e.get("seq", 0)), None)
            back = next((x.get("t") for x in events if x.get("kind") == "straggler"
                         and x.get("action") == "rejoin" and x.get("node") == e["node"]
                         and x.get("seq", 0) > e.get("seq", 0)), None)
            if scale_in is not None:
                _check_aside(row, run, int(scale_in.get("effective_step") or 0), lands, back)
        out.append(row)
    return out


def _check_aside(row: dict[str, Any], run: dict[str, Any], eff: int, lands: list[int],
                 back: float | None) -> None:
    node = next(n for n in sorted(run["nodes"]) if n != row["node"])
    steps = run["nodes"][node]["steps"]
    numbers = [int(x) for x, _ in steps]
    k = bisect_left(numbers, eff)
    if k >= len(numbers) or not row["predicted_step_ms_without"]:
        return
    t_eff = steps[k][1]
    end = min([p["t1"] for p in run["phases"] if p["t1"] > t_eff] or [steps[-1][1]])
    if back is not None:
        end = min(end, back)
    nxt = next((x for x in lands if x > eff), None)
    last = k
    while last + 1 < len(steps) and steps[last + 1][1] <= end and (
            nxt is None or numbers[last + 1] <= nxt):
        last += 1
    n = numbers[last] - eff
    row["window_steps"] = n
    if n >= MIN_WINDOW:
        ms = 1000.0 * (steps[last][1] - t_eff) / n
        row["measured_step_ms"] = round(ms, 3)
        row["error"] = round(row["predicted_step_ms_without"] / ms - 1.0, 4)


def _switches(run: dict[str, Any], steps: list[list[float]]) -> list[dict[str, Any]]:
    """The controller's switches, each with its prediction checked where a window allows."""
    changed = sorted((e for e in run["events"] if e.get("kind") == "policy-changed"),
                     key=lambda e: e.get("seq", 0))
    numbers = [int(s) for s, _ in steps]
    bounds = [p["t1"] for p in run["phases"]]
    # Where the members changed (a straggler set aside or back), and when that was decided: a
    # prediction was made for the members of its moment, so its window ends there, and a
    # change decided after it that lands first leaves it nothing to measure.
    moves = sorted((int(e["effective_step"]), float(e.get("t") or 0.0)) for e in run["events"]
                   if e.get("kind") in ("scale-in", "scale-out") and e.get("effective_step"))
    members = [m for m, _ in moves]
    # The rounds each switch lands on: the run starts in every-step (bench.py).
    rhythm, starts = Rhythm(), []
    for e in changed:
        step = rhythm.takes_over_at(int(e.get("effective_step") or 0))
        starts.append(step)
        mode = SyncMode.from_dict({"mode": e.get("sync", "every-step"),
                                   "inner_steps": e.get("inner_steps", 1),
                                   "fragments": e.get("fragments", 1)})
        rhythm = rhythm.switched(mode, step)
    out = []
    for i, e in enumerate(changed):
        eff = starts[i]
        row = {k: e.get(k) for k in ("t", "policy", "previous", "effective_step",
                                     "predicted_step_ms", "previous_chosen_ms",
                                     "previous_measured_ms", "gain", "reason", "floors_ns")}
        row["takes_over_at"] = eff
        row["measured_step_ms"] = row["error"] = None
        k = bisect_left(numbers, eff)
        # (stop 61, seed 15: n3 set aside 2 s after a switch was decided, landing 45 steps
        # before it; the two members left were "measured" 439 % faster than predicted.)
        row["members_changed_first"] = any(t > float(e.get("t") or 0.0) and m <= eff
                                           for m, t in moves)
        if k < len(numbers) and numbers[k] == eff and not row["members_changed_first"]:
            t_eff = steps[k][1]
            phase_end = next((b for b in bounds if b > t_eff), bounds[-1])
            ends = [x for x in (starts[i + 1] if i + 1 < len(changed) else None,
                                next((m for m in members if m > eff), None)) if x is not None]
            nxt = min(ends, default=None)
            last = k
            while last + 1 < len(steps) and steps[last + 1][1] <= phase_end and (
                    nxt is None or numbers[last + 1] <= nxt):
                last += 1
            period = int(e.get("inner_steps") or 1) // max(1, int(e.get("fragments") or 1))
            n = numbers[last] - eff
            row["window_steps"] = n
            if n >= max(MIN_WINDOW, 2 * period) and row["predicted_step_ms"]:
                ms = 1000.0 * (steps[last][1] - t_eff) / n
                row["measured_step_ms"] = round(ms, 3)
                row["error"] = round(row["predicted_step_ms"] / ms - 1.0, 4)
        out.append(row)
    return out


def _row(run: dict[str, Any], target: float) -> dict[str, Any]:
    steps = _eval_node(run)["steps"]
    switches = _switches(run, steps) if run["policy"] == ADAPTIVE else []
    evals = run["evals"]
    final = next((e for e in evals if e["final"]), evals[-1] if evals else None)
    hit = next((e["t"] for e in evals if e["val_loss"] <= target), None)
    return {
        "policy": run["policy"], "seed": run["seed"],
        "to_target_s": hit, "final_val_loss": final["val_loss"] if final else None,
        "final_val_acc": final["val_acc"] if final else None,
        "steps": int(steps[-1][0]) - run["start"] if steps else 0,
        "phase_steps_per_s": [_rate(steps, p["t0"], p["t1"]) for p in run["phases"]],
        "phase_samples_per_s": [_samples_rate(run, p["t0"], p["t1"]) for p in run["phases"]],
        "stragglers": _stragglers(run, switches),
        "phase_end_val_loss": [
            next((e["val_loss"] for e in reversed(evals) if e["t"] <= p["t1"] + 0.5), None)
            for p in run["phases"]],
        "switches": switches,
        "curve": [[e["t"], e["val_loss"]] for e in evals],
    }


def analyse(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Rows, the summary per policy, the prediction check and the goals' verdicts."""
    rows = [_row(r, target) for r in runs]
    policies = list(dict.fromkeys(r["policy"] for r in rows))
    phases = runs[0]["phases"] if runs else []
    summary = []
    for p in policies:
        group = [r for r in rows if r["policy"] == p]
        summary.append({
            "policy": p, "seeds": [r["seed"] for r in group],
            "reached": sum(r["to_target_s"] is not None for r in group),
            "to_target_s": spread([r["to_target_s"] for r in group]),
            "final_val_loss": spread([r["final_val_loss"] for r in group]),
            "phase_steps_per_s": [spread([r["phase_steps_per_s"][i] for r in group])
                                  for i in range(len(phases))],
            "phase_samples_per_s": [spread([r["phase_samples_per_s"][i] for r in group])
                                    for i in range(len(phases))]})
    levels = _levels(rows)
    for entry in summary:
        group = [r for r in rows if r["policy"] == entry["policy"]]
        entry["to_levels_s"] = {f"{lv:.1f}": spread([_hit(r, lv) for r in group])
                                for lv in levels}
    checked = [s for r in rows for s in r["switches"] if s["error"] is not None]
    errors = [abs(s["error"]) for s in checked]
    prediction = {"switches": sum(len(r["switches"]) for r in rows), "checked": len(checked),
                  "median_abs_error": statistics.median(errors) if errors else None,
                  "goal": PREDICTION_GOAL,
                  "met": bool(errors) and statistics.median(errors) <= PREDICTION_GOAL}
    asides = [s for r in rows for s in r["stragglers"] if s["action"] == "set-aside"]
    aside_errors = [abs(s["error"]) for s in asides if s["error"] is not None]
    prediction["stragglers"] = {
        "set_aside": len(asides), "checked": len(aside_errors),
        "median_abs_error": statistics.median(aside_errors) if aside_errors else None}
    return {"target_loss": target, "phases": [{k: p[k] for k in ("seconds", "mbit",
                                                                  "edge_mbit", "slow_ms")}
                                              for p in phases],
            "rows": rows, "summary": summary, "prediction": prediction,
            "goals": _goals(summary), "runs": runs}


def _hit(row: dict[str, Any], level: float) -> float | None:
    return next((t for t, v in row["curve"] if v <= level), None)


def _levels(rows: list[dict[str, Any]]) -> list[float]:
    """Every loss level 0.1 apart, from 3.0 down to the lowest any run reached: the whole
    time-to-loss curve, so that no level is picked after the fact."""
    best = min((v for r in rows for _, v in r["curve"]), default=3.0)
    return [k / 10 for k in range(30, 0, -1) if k / 10 >= best]


def _mean(s: dict[str, Any], key: str, i: int | None = None) -> float | None:
    v = s[key] if i is None else s[key][i]
    return None if v is None else float(v["mean"])


def _goals(summary: list[dict[str, Any]]) -> dict[str, Any]:
    ad = next((s for s in summary if s["policy"] == ADAPTIVE), None)
    fixed = [s for s in summary if s["policy"] != ADAPTIVE]
    if ad is None or not fixed:
        return {}
    n = len(ad["seeds"])
    # A policy that missed the target in some seed is slower than any that reached it in all.
    def key(s: dict[str, Any]) -> tuple[int, float]:
        return (n - s["reached"], _mean(s, "to_target_s") or float("inf"))
    first = min(summary, key=key) if any(s["reached"] for s in summary) else None
    phases = []
    for i in range(len(ad["phase_samples_per_s"])):
        best = max(fixed, key=lambda s: _mean(s, "phase_samples_per_s", i) or 0.0)
        a, b = _mean(ad, "phase_samples_per_s", i), _mean(best, "phase_samples_per_s", i)
        phases.append({"phase": i + 1, "best_fixed": best["policy"], "adaptive": a,
                       "best": b, "ratio": a / b if a and b else None,
                       "met": bool(a and b and a >= (1 - PHASE_SLACK) * b)})
    # The best fixed policy on time: the first to the target of those that reached it in
    # every seed; the adaptive run missing it in any seed is not within anything of it.
    timed = [s for s in fixed if s["reached"] == n]
    fast = min(timed, key=lambda s: _mean(s, "to_target_s") or float("inf"), default=None)
    a_t = _mean(ad, "to_target_s") if ad["reached"] == n else None
    b_t = _mean(fast, "to_target_s") if fast is not None else None
    lowest = min(fixed, key=lambda s: _mean(s, "final_val_loss") or float("inf"))
    return {"first_to_target": first["policy"] if first else None,
            "adaptive_first": first is ad,
            "to_target": {"best_fixed": fast["policy"] if fast else None, "adaptive_s": a_t,
                          "best_s": b_t, "ratio": a_t / b_t if a_t and b_t else None,
                          "met": bool(a_t and b_t and a_t <= (1 + PHASE_SLACK) * b_t)},
            "final_val_loss": {"lowest_fixed": lowest["policy"],
                               "adaptive": _mean(ad, "final_val_loss"),
                               "lowest": _mean(lowest, "final_val_loss")},
            "phases": phases, "every_phase_within_10pct": all(p["met"] for p in phases)}


def _fmt(v: dict[str, Any] | None, spec: str) -> str:
    if v is None:
        return "-"
    text = format(v["mean"], spec)
    return text + (f" ({format(v['min'], spec)}..{format(v['max'], spec)})" if v["n"] > 1
                   else "")


def table(doc: dict[str, Any]) -> str:
    """The summary as markdown: means over the seeds, (least..largest)."""
    n = len(doc["phases"])
    head = (f"| policy | seeds reaching {doc['target_loss']:g} | s to target | final val "
            f"loss | " + " | ".join(f"phase {i + 1} steps/s" for i in range(n)) + " |")
    lines = [head, "|" + "---|" * (4 + n)]
    for s in doc["summary"]:
        lines.append(
            f"| {s['policy']} | {s['reached']}/{len(s['seeds'])} | "
            f"{_fmt(s['to_target_s'], '.1f')} | {_fmt(s['final_val_loss'], '.3f')} | "
            + " | ".join(_fmt(v, ".1f") for v in s["phase_steps_per_s"]) + " |")
    lines += ["", "samples a second in each phase (steps every node committed, a second), "
              "mean (least..largest):", "",
              "| policy | " + " | ".join(f"phase {i + 1}" for i in range(n)) + " |",
              "|" + "---|" * (1 + n)]
    for s in doc["summary"]:
        lines.append(f"| {s['policy']} | "
                     + " | ".join(_fmt(v, ".1f") for v in s["phase_samples_per_s"]) + " |")
    levels = list(doc["summary"][0]["to_levels_s"]) if doc["summary"] else []
    if levels:
        lines += ["", "seconds to each validation loss, mean (seeds that reached it):", "",
                  "| policy | " + " | ".join(levels) + " |", "|" + "---|" * (1 + len(levels))]
        for s in doc["summary"]:
            cells = [f"{v['mean']:.1f} ({v['n']})" if v else "-"
                     for v in s["to_levels_s"].values()]
            lines.append(f"| {s['policy']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("phases: " + "; ".join(
        f"{i + 1}: {p['mbit']:g} Mbit/s"
        + (f", last node {p['edge_mbit']:g}" if p["edge_mbit"] is not None else "")
        + (f", last node +{p['slow_ms']:g} ms/step" if p["slow_ms"] else "")
        + f" for {p['seconds']:g} s" for i, p in enumerate(doc["phases"])))
    for r in (r for r in doc["rows"] if r["switches"]):
        for s in r["switches"]:
            check = ("; not measured: the members changed before it landed"
                     if s.get("members_changed_first") else "" if s["error"] is None else
                     f"; measured {s['measured_step_ms']:.1f} ms ({100 * s['error']:+.0f} %)")
            lands = s.get("takes_over_at", s["effective_step"])
            at = (f"step {s['effective_step']}" if lands == s["effective_step"]
                  else f"step {s['effective_step']} (lands at {lands})")
            floors = ", ".join(f"{w} {ns:.1f}" for w, ns in (s.get("floors_ns") or {}).items())
            lines.append(f"- seed {r['seed']}, t={s['t']:.1f} s, {at}: "
                         f"{s['previous']} -> {s['policy']}, predicted "
                         f"{s['predicted_step_ms'] or 0:.1f} ms{check}"
                         + (f" (floors learned, ns/element: {floors})" if floors else ""))
    for r in doc["rows"]:
        for e in r["stragglers"]:
            gain = (f", {e['predicted_gain']:+.0%} samples/s predicted"
                    if e["predicted_gain"] is not None else "")
            if e["action"] == "measured":
                got = e["measured_gain"]
                what = "measured " + ("-" if got is None else f"{got:+.0%}") + gain
                if e.get("policy_switched"):
                    what += " (the policy switched meanwhile)"
            elif e["action"] == "rejoin":
                what = f"let back in ({e['cause']})"
            else:
                what = f"set aside for its {e['cause']}{gain}"
                if e["predicted_step_ms_without"]:
                    what += f"; {e['predicted_step_ms_without']:.1f} ms a step predicted without"
                if e["error"] is not None:
                    what += (f", measured {e['measured_step_ms']:.1f} ms "
                             f"({100 * e['error']:+.0f} %)")
            lines.append(f"- seed {r['seed']}, t={e['t'] or 0:.1f} s: {e['node']} {what}")
    p, g = doc["prediction"], doc["goals"]
    med = p["median_abs_error"]
    lines.append(f"prediction: {p['checked']} of {p['switches']} switches checked, median "
                 f"|error| {'-' if med is None else format(100 * med, '.1f') + ' %'} (goal "
                 f"{100 * p['goal']:.0f} %): {'met' if p['met'] else 'NOT met'}")
    st = p.get("stragglers")
    if st and st["set_aside"]:
        med = st["median_abs_error"]
        lines.append(f"stragglers: {st['set_aside']} set aside, {st['checked']} checked, "
                     f"median |error| of the step time predicted without them "
                     f"{'-' if med is None else format(100 * med, '.1f') + ' %'}")
    if g:
        lines.append(f"first to the target: {g['first_to_target'] or 'none reached it'} "
                     f"({'met' if g['adaptive_first'] else 'NOT met'})")
        tt, fl = g["to_target"], g["final_val_loss"]
        if tt["best_fixed"] is None:
            lines.append("time to the target: no fixed policy reached it in every seed")
        else:
            ratio = "-" if tt["ratio"] is None else f"{tt['ratio']:.2f}x"
            lines.append(f"time to the target: adaptive at {ratio} that of "
                         f"{tt['best_fixed']}, the best fixed policy "
                         f"({'met' if tt['met'] else 'NOT met'}: within 10 %)")
        if fl["adaptive"] is not None and fl["lowest"] is not None:
            lines.append(f"final validation loss: adaptive {fl['adaptive']:.3f}, the lowest "
                         f"fixed {fl['lowest']:.3f} ({fl['lowest_fixed']})")
        for ph in g["phases"]:
            ratio = "-" if ph["ratio"] is None else f"{ph['ratio']:.2f}x"
            lines.append(f"phase {ph['phase']}: adaptive at {ratio} the samples a second of "
                         f"{ph['best_fixed']} ({'met' if ph['met'] else 'NOT met'})")
    return "\n".join(lines)


def draw(plt: Any, doc: dict[str, Any]) -> Any:
    """Three panels against time: the link rates, the validation loss of every run (a colour
    per policy), and the adaptive runs' choices (policies in black, stragglers in red)."""
    fig, axes = plt.subplots(3, 1, figsize=(10, 9), sharex=True,
                             gridspec_kw={"height_ratios": [1, 2, 1.2]})
    t, links, edge = [0.0], [], []
    for p in doc["phases"]:
        t.append(t[-1] + p["seconds"])
        links.append(p["mbit"])
        edge.append(p["edge_mbit"] if p["edge_mbit"] is not None else p["mbit"])
    axes[0].stairs(links, t, label="data links", linewidth=2, baseline=None)
    axes[0].stairs(edge, t, label="last node's links", linestyle="--", linewidth=2,
                   baseline=None)
    for i, p in enumerate(doc["phases"]):
        if p["slow_ms"]:
            axes[0].axvspan(t[i], t[i + 1], color="grey", alpha=0.2,
                            label=f"last node +{p['slow_ms']:g} ms/step")
    axes[0].set(yscale="log", ylabel="Mbit/s")
    colour = {p: f"C{i % 10}" for i, p in enumerate(s["policy"] for s in doc["summary"])}
    labelled: set[str] = set()
    for r in doc["rows"]:
        c, p = r["curve"], r["policy"]
        axes[1].plot([x for x, _ in c], [y for _, y in c], color=colour[p], alpha=0.8,
                     linewidth=2 if p == ADAPTIVE else 1,
                     label=None if p in labelled else p)
        labelled.add(p)
    axes[1].axhline(doc["target_loss"], color="k", linestyle=":", linewidth=1,
                    label="target")
    axes[1].set(ylabel="validation loss")
    adaptive = [r for r in doc["rows"] if r["policy"] == ADAPTIVE]
    for y, r in enumerate(adaptive):
        for s in r["switches"]:
            axes[2].plot([s["t"]], [y], marker="|", markersize=14, color="k")
            axes[2].annotate(s["policy"], (s["t"], y), textcoords="offset points",
                             xytext=(3, 4), fontsize=7)
        for e in r["stragglers"]:
            if e["action"] in ("set-aside", "rejoin") and e["t"] is not None:
                axes[2].plot([e["t"]], [y], marker="v" if e["action"] == "set-aside" else "^",
                             markersize=8, color="C3")
                axes[2].annotate(f"{e['node']} {'aside' if e['action'] == 'set-aside' else 'back'}",
                                 (e["t"], y), textcoords="offset points", xytext=(3, -10),
                                 fontsize=7, color="C3")
    axes[2].set(ylabel="adaptive: seed", xlabel="seconds since the schedule began",
                yticks=range(len(adaptive)), yticklabels=[str(r["seed"]) for r in adaptive],
                ylim=(-0.5, max(len(adaptive), 1) - 0.2))
    for ax in axes:
        ax.grid(alpha=0.3)
        for x in t[1:-1]:
            ax.axvline(x, color="grey", linewidth=0.8)
    axes[0].legend(fontsize=8)
    axes[1].legend(fontsize=8)
    return fig


def write(doc: dict[str, Any], out: Path, say: Say) -> None:
    """``adaptive.json``, ``adaptive.md`` and ``adaptive.png`` under ``out``."""
    output = Output(out, say)
    output.json("adaptive.json", doc)
    output.text("adaptive.md", table(doc))
    output.figure("adaptive.png", lambda plt: draw(plt, doc))
