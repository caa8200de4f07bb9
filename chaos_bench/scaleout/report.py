"""Summaries and outputs of ``chaosctl bench scaleout``: rows, markdown, JSON and the PNG."""

from __future__ import annotations

import statistics
from typing import Any

from chaos_bench.output import Output
from chaos_edge.replication.manifest import Manifest
from chaos_edge.replication.planning.model import Neighbor, PlanInput
from chaos_edge.replication.planning.waterfill import lower_bound

# ``chaos-paper`` is the chaos strategy with the paper's planner (Algorithms 1+2), run beside
# the default planner; the baselines are the other systems. ``plain`` (plain sockets, the
# water-filling split, no protocol) is what the links allow through Python sockets: it is run
# beside them but is no scale-out system, so it has no idle time.
STRATEGIES = ("chaos", "chaos-paper", "single", "multi-source", "stop-resume")
RUNS = (*STRATEGIES, "plain")
BASELINES = ("single", "multi-source", "stop-resume")
SHORT = {"chaos": "chaos", "chaos-paper": "paper", "single": "single", "multi-source": "multi",
         "stop-resume": "stop", "plain": "plain"}
IDLE_DEFINITION = (
    "Cluster idle time (Fig. 10), node-seconds over the N existing nodes (new node not counted). "
    "Measured busy_node_s: per state server, first replication request to last byte sent or "
    "relayed (sampled every 10 ms), summed over nodes. idle_s: chaos, paper and multi-source = "
    "busy_node_s (serving/relaying nodes counted as paused, as in the paper); single (EDL+) = "
    "N x delay (modelled: EDL+'s barrier makes all nodes wait); stop-resume (Pollux) = "
    "N x delay (modelled: every node stops)."
)


def waterfill(rates_mbps: dict[str, float], manifest: Manifest) -> float:
    """The water-filling lower bound (s) of pulling the state over links of these rates."""
    nbrs = [Neighbor(n, 0.0, 8 / (r * 1e6)) for n, r in rates_mbps.items() if r > 0]
    return lower_bound(PlanInput.create(nbrs, [manifest.total_bytes]))


def idle(name: str, res: dict[str, Any], size: int) -> tuple[float, float, int]:
    """``(idle_s, busy_node_s, participants)`` of one strategy's run (see the definition)."""
    moved = [s for s in res["servers"].values() if s["bytes_sent"] + s["bytes_relayed"] > 0]
    busy = sum(s["busy_s"] for s in moved)
    if name in ("single", "stop-resume"):
        return size * res["delay_s"], busy, len(moved) if name == "single" else size
    return busy, busy, len(moved)


def spread(res: dict[str, Any]) -> float:
    """Seconds between the first and the last of a run's sources to finish sending."""
    ends = [v[1] for v in res.get("sources", {}).values() if v[1] is not None and v[2] > 0]
    return max(ends) - min(ends) if ends else 0.0


def summarise(instances: list[dict[str, Any]], manifests: dict[str, Manifest]) -> list[dict]:
    """One row per (size, model): medians over the repeats, per-repeat ratios' medians."""
    groups: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for inst in instances:
        new = inst["new"]
        cfg = {n: inst["configured_mbps"]["-".join(sorted((n, new), key=lambda x: int(x[1:])))]
               for n in inst["neighbours"]}
        for model, res in inst["models"].items():
            one: dict[str, Any] = {
                "lb_meas": waterfill(inst["measured_mbps"], manifests[model]),
                "lb_ach": waterfill(inst["concurrent_mbps"], manifests[model]),
                "lb_cfg": waterfill(cfg, manifests[model]),
                "delay": {s: res[s]["delay_s"] for s in RUNS},
                "spread": spread(res["chaos"]),
                "decision": {}, "idle": {}, "busy": {}, "participants": {}}
            for s in STRATEGIES:
                one["decision"][s] = res[s].get("decision_s", 0.0)
                i, b, p = idle(s, res[s], inst["size"])
                one["idle"][s], one["busy"][s], one["participants"][s] = i, b, p
            one["verified"] = all(res[s]["verified"] for s in RUNS)
            one["neighbours"] = len(inst["neighbours"])
            groups.setdefault((inst["size"], model), []).append(one)
    rows = []
    for (size, model), runs in groups.items():
        def med(f: Any, runs: list[dict[str, Any]] = runs) -> float:
            return float(statistics.median(f(r) for r in runs))

        def span(f: Any, runs: list[dict[str, Any]] = runs) -> list[float]:
            """The least and the largest over the repeats (the spread of a median)."""
            values = [float(f(r)) for r in runs]
            return [round(min(values), 4), round(max(values), 4)]

        rows.append({
            "size": size, "model": model, "mib": manifests[model].total_bytes / (1 << 20),
            "repeats": len(runs), "neighbours": med(lambda r: r["neighbours"]),
            "delay_s": {s: med(lambda r, s=s: r["delay"][s]) for s in RUNS},
            "lb_achievable_s": med(lambda r: r["lb_ach"]),
            "lb_measured_s": med(lambda r: r["lb_meas"]),
            "lb_configured_s": med(lambda r: r["lb_cfg"]),
            "chaos_over_lb_achievable": med(lambda r: r["delay"]["chaos"] / r["lb_ach"]),
            "paper_over_lb_achievable": med(lambda r: r["delay"]["chaos-paper"] / r["lb_ach"]),
            "plain_over_lb_achievable": med(lambda r: r["delay"]["plain"] / r["lb_ach"]),
            "chaos_over_plain": med(lambda r: r["delay"]["chaos"] / r["delay"]["plain"]),
            "chaos_over_lb_achievable_range": span(
                lambda r: r["delay"]["chaos"] / r["lb_ach"]),
            "chaos_over_plain_range": span(lambda r: r["delay"]["chaos"] / r["delay"]["plain"]),
            "chaos_over_lb_measured": med(lambda r: r["delay"]["chaos"] / r["lb_meas"]),
            "chaos_over_lb_configured": med(lambda r: r["delay"]["chaos"] / r["lb_cfg"]),
            "paper_over_lb_measured": med(lambda r: r["delay"]["chaos-paper"] / r["lb_meas"]),
            "chaos_finish_spread_s": med(lambda r: r["spread"]),
            "paper_over_chaos": med(lambda r: r["delay"]["chaos-paper"] / r["delay"]["chaos"]),
            "decision_ms": {s: med(lambda r, s=s: r["decision"][s]) * 1e3
                            for s in ("chaos", "chaos-paper")},
            "baseline_over_chaos": {s: med(lambda r, s=s: r["delay"][s] / r["delay"]["chaos"])
                                    for s in BASELINES},
            "idle_s": {s: med(lambda r, s=s: r["idle"][s]) for s in STRATEGIES},
            "busy_node_s": {s: med(lambda r, s=s: r["busy"][s]) for s in STRATEGIES},
            "participants": {s: med(lambda r, s=s: r["participants"][s]) for s in STRATEGIES},
            "chaos_fastest_every_repeat": all(
                r["delay"]["chaos"] < r["delay"][s] for r in runs for s in BASELINES),
            "verified": all(r["verified"] for r in runs),
        })
    return sorted(rows, key=lambda r: (r["model"], r["size"]))


COLUMNS = ("N", "model", "MiB", "K", *(f"{SHORT[s]} s" for s in RUNS), "LB ach s",
           "LB meas s", "LB cfg s", "chaos/LBa", "paper/LBa", "plain/LBa", "chaos/plain",
           "chaos/LBm", "paper/LBm", *(f"{SHORT[s]}/chaos" for s in BASELINES),
           *(f"idle {SHORT[s]}" for s in STRATEGIES))


def cells(r: dict[str, Any]) -> list[str]:
    """The table cells of one row (same order as :data:`COLUMNS`)."""
    d, b, i = r["delay_s"], r["baseline_over_chaos"], r["idle_s"]
    return [f"{r['size']}->{r['size'] + 1}", r["model"], f"{r['mib']:.0f}",
            f"{r['neighbours']:g}", *(f"{d[s]:.2f}" for s in RUNS),
            f"{r['lb_achievable_s']:.2f}", f"{r['lb_measured_s']:.2f}",
            f"{r['lb_configured_s']:.2f}", f"{r['chaos_over_lb_achievable']:.3f}",
            f"{r['paper_over_lb_achievable']:.3f}", f"{r['plain_over_lb_achievable']:.3f}",
            f"{r['chaos_over_plain']:.3f}",
            f"{r['chaos_over_lb_measured']:.3f}", f"{r['paper_over_lb_measured']:.3f}",
            *(f"{b[s]:.2f}" for s in BASELINES),
            *(f"{i[s]:.1f}" for s in STRATEGIES)]


def markdown(doc: dict[str, Any]) -> str:
    """The markdown table, with the run's parameters and the idle-time definition."""
    m = doc["meta"]
    shape = (f"a star: the new node and {len(m['star_mbps'])} neighbours at "
             f"{'/'.join(f'{r:g}' for r in m['star_mbps'])} Mbit/s (tbf)"
             if m.get("star_mbps") else
             f"sizes {m['sizes']}, links {m['bw_mbps'][0]:g}-{m['bw_mbps'][1]:g} Mbit/s (tbf), "
             f"new node degree {m['degree']}")
    lines = [
        f"Scale-out on the netns testbed: {shape}, models {m['models']}, "
        f"{m['repeats']} repeat(s); medians over repeats; seconds. K = new node's "
        "neighbours. chaos = the chaos strategy with its default planner (water-filling) and "
        "run-time rebalancing, paper = the same strategy with the paper's Algorithms 1+2, "
        "plain = plain sockets with the water-filling split (a baseline, not a bound: no "
        "protocol, no verification on the clock). LB = the bound: water-filling over the new "
        "node's links (computed, not run), from iperf3 "
        "rates measured all at once (ach: achievable, what the links deliver together on this "
        "box; the plans use these rates), one link at a time (meas), or the configured tbf "
        "rates (cfg). Idle in node-seconds.",
        "",
        "| " + " | ".join(COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    lines += ["| " + " | ".join(cells(r)) + " |" for r in doc["rows"]]
    lines += ["", IDLE_DEFINITION, ""]
    return "\n".join(lines)


def draw(plt: Any, doc: dict[str, Any]) -> Any:
    """Fig. 7 (delay) and Fig. 10 (idle) per model vs cluster size."""
    models = list(dict.fromkeys(r["model"] for r in doc["rows"]))
    fig, axes = plt.subplots(2, len(models), figsize=(4.5 * len(models), 7), squeeze=False)
    for j, model in enumerate(models):
        rows = [r for r in doc["rows"] if r["model"] == model]
        xs = [r["size"] for r in rows]
        labels = [f"{r['size']}->{r['size'] + 1}" for r in rows]
        for s in RUNS:
            axes[0][j].plot(xs, [r["delay_s"][s] for r in rows], "o-", label=s)
        for s in STRATEGIES:
            axes[1][j].plot(xs, [max(r["idle_s"][s], 1e-3) for r in rows], "o-", label=s)
        axes[0][j].plot(xs, [r["lb_achievable_s"] for r in rows], "k--", label="LB (achievable)")
        axes[0][j].plot(xs, [r["lb_measured_s"] for r in rows], "k:", label="LB (one at a time)")
        axes[0][j].set_title(f"{model} ({rows[0]['mib']:.0f} MiB): scale-out delay")
        axes[1][j].set_title(f"{model}: cluster idle time")
        axes[0][j].set_ylabel("seconds")
        axes[1][j].set_ylabel("node-seconds")
        for ax in (axes[0][j], axes[1][j]):
            ax.set_yscale("log")
            ax.set_xticks(xs, labels)
            ax.grid(alpha=0.3)
        axes[0][j].legend(fontsize=7)
    fig.suptitle("Scale-out on the netns testbed (tbf links), medians over repeats")
    return fig


def write(output: Output, doc: dict[str, Any]) -> None:
    """``scaleout.json``, ``scaleout.md`` and ``scaleout.png``."""
    output.json("scaleout.json", doc)
    output.text("scaleout.md", markdown(doc))
    output.figure("scaleout.png", lambda plt: draw(plt, doc))
