"""The slow-links bench's analysis: one row per rate and mode, the issue's goal, the plot.

Per run: ``wall_s`` (the evaluating node's time for the training steps, evaluations left
out), ``to_target_s`` (its wall time at the first evaluation that reached the target
accuracy, None if none did), ``mb_per_node`` (mean over the nodes of the bytes their data
links sent in those steps, headers included), the final test accuracy and loss, and the
ratios to the every-step run at the same rate. The goal (issue 13), checked at 50 Mbit/s for
every H: final accuracy within 1 point of every-step's (or loss within 2 %), at least 10x
fewer bytes, and less wall time.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos_bench.output import Output
from chaos_bench.progress import Say

GOAL_RATE = 50.0


def _row(run: dict[str, Any], target: float) -> dict[str, Any]:
    nodes = run["nodes"]
    evaluator = next(d for d in nodes.values() if d["evals"])
    evals = evaluator["evals"]
    final = evals[-1]
    hit = next((e["t"] for e in evals if e["acc"] >= target), None)
    tx = [d["tx_bytes"] for d in nodes.values()]
    late = {n: d["began"] - d["start"] for n, d in nodes.items() if d["began"] != d["start"]}
    return {
        "rate_mbps": run["rate_mbps"], "mode": run["mode"], "inner_steps": run["inner_steps"],
        "steps": evaluator["steps"], "wall_s": evaluator["wall_s"], "to_target_s": hit,
        "mb_per_node": sum(tx) / len(tx) / 1e6, "mb_max_node": max(tx) / 1e6,
        "acc": final["acc"], "loss": final["loss"], "late_starts": late,
        "curve": [{k: e[k] for k in ("step", "t", "tx", "loss", "acc")} for e in evals],
    }


def analyse(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Rows with ratios to every-step at the same rate, and the goal's verdicts."""
    rows = [_row(r, target) for r in runs]
    base = {r["rate_mbps"]: r for r in rows if r["inner_steps"] == 1}
    for r in rows:
        b = base.get(r["rate_mbps"])
        if b is None:
            continue
        r["bytes_x_fewer"] = b["mb_per_node"] / r["mb_per_node"] if r["mb_per_node"] else None
        r["time_x_faster"] = b["wall_s"] / r["wall_s"] if r["wall_s"] else None
        r["acc_pts_vs_every_step"] = 100 * (r["acc"] - b["acc"])
        r["loss_pct_vs_every_step"] = 100 * (r["loss"] / b["loss"] - 1) if b["loss"] else None
    goal = []
    for r in rows:
        if r["rate_mbps"] != GOAL_RATE or r["inner_steps"] == 1 or "bytes_x_fewer" not in r:
            continue
        quality = r["acc_pts_vs_every_step"] >= -1.0 or (
            r["loss_pct_vs_every_step"] is not None and r["loss_pct_vs_every_step"] <= 2.0)
        checks = {"quality": quality, "bytes_10x": (r["bytes_x_fewer"] or 0) >= 10.0,
                  "less_time": r["wall_s"] < base[GOAL_RATE]["wall_s"]}
        goal.append({"mode": r["mode"], **checks, "met": all(checks.values())})
    return {"target_acc": target, "rows": rows, "goal_at_50mbps": goal}


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def table(doc: dict[str, Any]) -> str:
    """The rows as a fixed-width table."""
    head = (f"{'Mbit/s':>6}  {'mode':<13} {'wall s':>7} {'to ' + str(doc['target_acc']):>8} "
            f"{'MB/node':>8} {'bytes x':>8} {'time x':>7} {'acc %':>6} {'d pts':>6} "
            f"{'loss':>6}")
    lines = [head, "-" * len(head)]
    for r in doc["rows"]:
        lines.append(
            f"{r['rate_mbps']:>6g}  {r['mode']:<13} {r['wall_s']:>7.1f} "
            f"{_fmt(r['to_target_s'], '>8.1f')} {r['mb_per_node']:>8.2f} "
            f"{_fmt(r.get('bytes_x_fewer'), '>8.1f')} {_fmt(r.get('time_x_faster'), '>7.2f')} "
            f"{100 * r['acc']:>6.1f} {_fmt(r.get('acc_pts_vs_every_step'), '>+6.1f')} "
            f"{r['loss']:>6.3f}")
    for g in doc["goal_at_50mbps"]:
        verdict = "met" if g["met"] else "NOT met (" + ", ".join(
            k for k in ("quality", "bytes_10x", "less_time") if not g[k]) + ")"
        lines.append(f"goal at 50 Mbit/s, {g['mode']}: {verdict}")
    return "\n".join(lines)


def draw(plt: Any, doc: dict[str, Any]) -> Any:
    """Test loss against wall time and against bytes per node, one column per rate."""
    rates = sorted({r["rate_mbps"] for r in doc["rows"]})
    fig, axes = plt.subplots(2, len(rates), figsize=(4.5 * len(rates), 7), squeeze=False)
    for col, rate in enumerate(rates):
        for r in (r for r in doc["rows"] if r["rate_mbps"] == rate):
            c = r["curve"]
            axes[0][col].plot([e["t"] for e in c], [e["loss"] for e in c], marker=".",
                              label=r["mode"])
            # The first point (nothing sent yet) sits at 10 kB on the log axis.
            axes[1][col].plot([max(e["tx"], 10_000) / 1e6 for e in c], [e["loss"] for e in c],
                              marker=".", label=r["mode"])
        axes[0][col].set(title=f"{rate:g} Mbit/s", xlabel="wall time (s)", ylabel="test loss")
        axes[1][col].set(xlabel="MB sent by the evaluating node", ylabel="test loss",
                         xscale="log")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_yscale("log")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    return fig


def write(doc: dict[str, Any], out: Path, say: Say) -> None:
    """``slowlinks.json`` and ``slowlinks.png`` under ``out``."""
    output = Output(out, say)
    output.json("slowlinks.json", doc)
    output.figure("slowlinks.png", lambda plt: draw(plt, doc))
