"""The slow-links bench's analysis: one row per run, a summary over seeds, the goal, the plot.

Per run: ``wall_s`` (the evaluating node's time for the training steps, evaluations left
out), ``to_target_s`` (its wall time at the first evaluation that reached the target test
accuracy, None if none did), ``mb_per_node`` (mean over the nodes of the bytes their data
links sent in those steps, headers included), the final test and validation accuracy and
loss, and the ratios to the every-step (fp32) run of the same rate and seed; ``time_x_best``
is against the fastest every-step run of that rate and seed (fp32 or another wire).

The summary gives, per rate and mode, the median and the least and largest over the seeds.
The goal (issue 13), checked at 50 Mbit/s for every DiLoCo H, on the seeds' means: final
test accuracy within 1 point of every-step's, test loss within 2 % of it (both stated, the
goal met only with both), at least 10x fewer bytes, and less wall time than the fastest
every-step run in every seed.

Per run also ``round_mb_max`` and ``round_s_max``: the most bytes any node sent in one
``update()`` that ran a round, and the longest such call (the peak a link must carry at once,
and the longest stall). The streaming goal (issue 24), checked at 20 Mbit/s for every streaming
mode on the seeds' means: at least 100x fewer bytes than the fastest every-step run, a
validation loss within 1 % of that run's, and a smaller peak than DiLoCo at the same H.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_bench.stats import spread as _spread

GOAL_RATE = 50.0
STREAMING_RATE = 20.0
BASE = "every-step"
SPREAD = ("wall_s", "to_target_s", "mb_per_node", "acc", "loss", "val_acc", "val_loss",
          "bytes_x_fewer", "time_x_faster", "time_x_best", "acc_pts_vs_every_step",
          "loss_pct_vs_every_step", "round_mb_max", "round_s_max", "bytes_x_fewer_best",
          "val_loss_pct_vs_best")


def _row(run: dict[str, Any], target: float) -> dict[str, Any]:
    nodes = run["nodes"]
    evaluator = next(d for d in nodes.values() if d["evals"])
    evals = evaluator["evals"]
    final = evals[-1]
    hit = next((e["t"] for e in evals if e["acc"] >= target), None)
    tx = [d["tx_bytes"] for d in nodes.values()]
    late = {n: d["began"] - d["start"] for n, d in nodes.items() if d["began"] != d["start"]}
    keys = ("step", "t", "tx", "loss", "acc", "val_loss", "val_acc")
    peaks = [d.get("rounds") or {} for d in nodes.values()]
    sent = [p["bytes_max"] for p in peaks if p.get("n")]
    stalls = [p["s_max"] for p in peaks if p.get("n")]
    return {
        "rate_mbps": run["rate_mbps"], "mode": run["mode"], "inner_steps": run["inner_steps"],
        "seed": run.get("seed", 0), "config": run.get("config", {}),
        "steps": evaluator["steps"], "wall_s": evaluator["wall_s"], "to_target_s": hit,
        "mb_per_node": sum(tx) / len(tx) / 1e6, "mb_max_node": max(tx) / 1e6,
        "acc": final["acc"], "loss": final["loss"], "val_acc": final.get("val_acc"),
        "val_loss": final.get("val_loss"), "late_starts": late,
        "round_mb_max": max(sent) / 1e6 if sent else None,
        "round_s_max": max(stalls) if stalls else None,
        "curve": [{k: e[k] for k in keys if k in e} for e in evals],
    }


def _ratios(rows: list[dict[str, Any]]) -> None:
    """Each row against the every-step rows of its rate and seed."""
    for r in rows:
        same = [b for b in rows if (b["rate_mbps"], b["seed"]) == (r["rate_mbps"], r["seed"])
                and b["inner_steps"] == 1]
        b = next((x for x in same if x["mode"] == BASE), None)
        if b is None:
            continue
        r["bytes_x_fewer"] = b["mb_per_node"] / r["mb_per_node"] if r["mb_per_node"] else None
        r["time_x_faster"] = b["wall_s"] / r["wall_s"] if r["wall_s"] else None
        r["time_x_best"] = min(x["wall_s"] for x in same) / r["wall_s"] if r["wall_s"] else None
        r["acc_pts_vs_every_step"] = 100 * (r["acc"] - b["acc"])
        r["loss_pct_vs_every_step"] = 100 * (r["loss"] / b["loss"] - 1) if b["loss"] else None
        best = min(same, key=lambda x: x["wall_s"])  # the fastest every-step run
        r["bytes_x_fewer_best"] = (best["mb_per_node"] / r["mb_per_node"]
                                   if r["mb_per_node"] else None)
        r["val_loss_pct_vs_best"] = (100 * (r["val_loss"] / best["val_loss"] - 1)
                                     if r["val_loss"] is not None and best["val_loss"] else None)


def summarise(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (rate, mode), in run order: the spread over seeds of every figure."""
    keys: list[tuple[float, str]] = []
    for r in rows:
        if (r["rate_mbps"], r["mode"]) not in keys:
            keys.append((r["rate_mbps"], r["mode"]))
    out = []
    for rate, mode in keys:
        group = [r for r in rows if (r["rate_mbps"], r["mode"]) == (rate, mode)]
        out.append({"rate_mbps": rate, "mode": mode, "inner_steps": group[0]["inner_steps"],
                    "seeds": [r["seed"] for r in group],
                    **{k: _spread([r.get(k) for r in group]) for k in SPREAD}})
    return out


def goal(rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's goal at GOAL_RATE for every DiLoCo H (means over the seeds)."""
    verdicts = []
    for s in summary:
        if s["rate_mbps"] != GOAL_RATE or s["inner_steps"] == 1 or s["bytes_x_fewer"] is None:
            continue
        runs = [r for r in rows if (r["rate_mbps"], r["mode"]) == (GOAL_RATE, s["mode"])]
        loss = s["loss_pct_vs_every_step"]
        checks = {"accuracy": s["acc_pts_vs_every_step"]["mean"] >= -1.0,
                  "loss": loss is not None and loss["mean"] <= 2.0,
                  "bytes_10x": s["bytes_x_fewer"]["mean"] >= 10.0,
                  "less_time": all((r.get("time_x_best") or 0) > 1.0 for r in runs)}
        verdicts.append({"mode": s["mode"], **checks, "met": all(checks.values())})
    return verdicts


def streaming_goal(summary: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Issue 24's streaming goal at STREAMING_RATE for every streaming mode (means over the
    seeds): 100x fewer bytes than the fastest every-step run, a validation loss within 1 % of
    it, and a smaller peak (bytes of one round) than DiLoCo at the same H and wire."""
    verdicts = []
    by_mode = {s["mode"]: s for s in summary if s["rate_mbps"] == STREAMING_RATE}
    for mode, s in by_mode.items():
        if not mode.startswith("streaming") or s["bytes_x_fewer_best"] is None:
            continue
        words = [w for w in mode.split() if w != "overlap"]
        dil = by_mode.get(" ".join(["diloco", words[1], *words[3:]]))
        peak, dil_peak = s["round_mb_max"], dil["round_mb_max"] if dil else None
        loss = s["val_loss_pct_vs_best"]
        checks = {"bytes_100x": s["bytes_x_fewer_best"]["mean"] >= 100.0,
                  "val_loss_1pct": loss is not None and loss["mean"] <= 1.0,
                  "peak_below_diloco": (peak is not None and dil_peak is not None
                                        and peak["mean"] < dil_peak["mean"])}
        verdicts.append({"mode": mode, **checks, "met": all(checks.values())})
    return verdicts


def analyse(runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """Rows with ratios, the summary over seeds and the goals' verdicts."""
    rows = [_row(r, target) for r in runs]
    _ratios(rows)
    summary = summarise(rows)
    return {"target_acc": target, "rows": rows, "summary": summary,
            "goal_at_50mbps": goal(rows, summary),
            "streaming_goal_at_20mbps": streaming_goal(summary)}


def _fmt(value: Any, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _med(s: dict[str, Any], key: str, spec: str, spread: bool = True) -> str:
    v = s.get(key)
    if v is None:
        return "-"
    text = format(v["median"], spec)
    if spread and v["n"] > 1:
        text += f" ({format(v['min'], spec)}..{format(v['max'], spec)})"
    return text


def table(doc: dict[str, Any]) -> str:
    """The summary as a fixed-width table: medians over the seeds, (least..largest)."""
    head = (f"{'Mbit/s':>6}  {'mode':<16} {'seeds':>5}  {'wall s':<18} "
            f"{'s to ' + format(doc['target_acc'], 'g'):<18} {'MB/node':>8} "
            f"{'bytes x':>7}  {'time x (vs fastest)':<22} {'test acc %':<19} "
            f"{'test loss':<21} {'val loss':>8} {'MB/round':>8} {'round s':>7}")
    lines = [head, "-" * len(head)]
    for s in doc["summary"]:
        acc = s["acc"]
        acc_text = "-" if acc is None else f"{100 * acc['median']:.1f}" + (
            f" ({100 * acc['min']:.1f}..{100 * acc['max']:.1f})" if acc["n"] > 1 else "")
        lines.append(
            f"{s['rate_mbps']:>6g}  {s['mode']:<16} {len(s['seeds']):>5}  "
            f"{_med(s, 'wall_s', '.1f'):<18} {_med(s, 'to_target_s', '.1f'):<18} "
            f"{_med(s, 'mb_per_node', '.1f', False):>8} "
            f"{_med(s, 'bytes_x_fewer', '.1f', False):>7}  "
            f"{_med(s, 'time_x_faster', '.2f', False):>6} ({_med(s, 'time_x_best', '.2f')})"
            f"{'':<1} {acc_text:<19} {_med(s, 'loss', '.3f'):<21} "
            f"{_med(s, 'val_loss', '.3f', False):>8} "
            f"{_med(s, 'round_mb_max', '.3f', False):>8} "
            f"{_med(s, 'round_s_max', '.2f', False):>7}")
    for g in doc["goal_at_50mbps"]:
        verdict = "met" if g["met"] else "NOT met (" + ", ".join(
            k for k in ("accuracy", "loss", "bytes_10x", "less_time") if not g[k]) + ")"
        lines.append(f"goal at 50 Mbit/s, {g['mode']}: {verdict}")
    for g in doc.get("streaming_goal_at_20mbps", []):
        verdict = "met" if g["met"] else "NOT met (" + ", ".join(
            k for k in ("bytes_100x", "val_loss_1pct", "peak_below_diloco") if not g[k]) + ")"
        lines.append(f"streaming goal at 20 Mbit/s, {g['mode']}: {verdict}")
    return "\n".join(lines)


def draw(plt: Any, doc: dict[str, Any]) -> Any:
    """Test loss against wall time and against bytes per node, one column per rate; one
    colour per mode, one line per seed."""
    rates = sorted({r["rate_mbps"] for r in doc["rows"]})
    names = list(dict.fromkeys(r["mode"] for r in doc["rows"]))
    colour = {m: f"C{i % 10}" for i, m in enumerate(names)}
    fig, axes = plt.subplots(2, len(rates), figsize=(4.5 * len(rates), 7), squeeze=False)
    for col, rate in enumerate(rates):
        labelled: set[str] = set()
        for r in (r for r in doc["rows"] if r["rate_mbps"] == rate):
            c, m = r["curve"], r["mode"]
            label = None if m in labelled else m
            labelled.add(m)
            axes[0][col].plot([e["t"] for e in c], [e["loss"] for e in c], marker=".",
                              color=colour[m], alpha=0.8, label=label)
            # The first point (nothing sent yet) sits at 10 kB on the log axis.
            axes[1][col].plot([max(e["tx"], 10_000) / 1e6 for e in c], [e["loss"] for e in c],
                              marker=".", color=colour[m], alpha=0.8, label=label)
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
