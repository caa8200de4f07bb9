"""The simulation's JSON, markdown and PNG, and the rich tables the command prints."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from chaos_bench.output import Output
from chaos_bench.sim.broker import PATTERNS
from chaos_bench.sim.scaleout import STRATEGIES

SHORT = {"chaos": "chaos", "single": "single", "multi-source": "multi", "stop-resume": "stop"}


def _f(v: float | None, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f}"


def _kib(nbytes: float | None) -> float | None:
    return None if nbytes is None else nbytes / 1024


def validation_lines(doc: dict[str, Any]) -> list[str]:
    """Markdown: the summary, then every point's error."""
    val = doc.get("validation")
    if not val:
        return ["No validation: no testbed results were given."]
    lines = ["| strategy | metric | points | median abs error | max abs error | within 15% |",
             "|---|---|---:|---:|---:|---:|"]
    for r in val["summary"]:
        lines.append(f"| {r['strategy']} | {r['metric']} | {r['points']} | "
                     f"{r['median_abs_err']:.1%} | {r['max_abs_err']:.1%} | "
                     f"{r['within']}/{r['points']} |")
    lines += ["", "| N | model | strategy | delay testbed s | delay sim s | error | idle testbed "
              "node-s | idle sim node-s | error |", "|---|---|---|---:|---:|---:|---:|---:|---:|"]
    for p in val["points"]:
        lines.append(f"| {p['size']}->{p['size'] + 1} | {p['model']} | {p['strategy']} | "
                     f"{p['delay_real_s']:.2f} | {p['delay_sim_s']:.2f} | {p['delay_err']:+.1%} | "
                     f"{p['idle_real_s']:.1f} | {p['idle_sim_s']:.1f} | {p['idle_err']:+.1%} |")
    return lines


def holdout_lines(doc: dict[str, Any]) -> list[str]:
    """Markdown: the out-of-sample prediction, unique points only, predicted and fitted apart."""
    ho = doc.get("holdout")
    if not ho:
        return ["No out-of-sample check: no --holdout results were given."]
    fit = ho["fitted_on"]
    lines = [f"Fitted on {doc['meta'].get('testbed')}: goodput {fit['efficiency']:.3f} x the "
             f"tbf rate, {fit['together_ratio']:.3f} x that while other neighbour links are "
             f"busy, restart {fit['costs']['restart_s']:.2f} s. Predicted: {ho['instances']} "
             f"instances of {doc['meta'].get('holdout')} (N = "
             f"{', '.join(str(n) for n in ho['sizes'])}) from their configured rates alone.", "",
             "| strategies | unique points | median abs error | max abs error | within 15% |",
             "|---|---:|---:|---:|---:|"]
    for g in ho["groups"]:
        lines.append(f"| {g['group']}: {', '.join(g['strategies'])} | {g['points']} | "
                     f"{_pct(g['median_abs_err'])} | {_pct(g['max_abs_err'])} | "
                     f"{g['within']}/{g['points']} |")
    lines += ["", "| strategy | metric | points | median abs error | max abs error | within 15% |",
              "|---|---|---:|---:|---:|---:|"]
    for r in ho["unique"]:
        lines.append(f"| {r['strategy']} | {r['metric']} | {r['points']} | "
                     f"{_pct(r['median_abs_err'])} | {_pct(r['max_abs_err'])} | "
                     f"{r['within']}/{r['points']} |")
    return lines


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x:.1%}"


def sweep_lines(doc: dict[str, Any]) -> list[str]:
    cols = " | ".join(f"{SHORT[s]} s" for s in STRATEGIES)
    idle = " | ".join(f"idle {SHORT[s]}" for s in STRATEGIES)
    lines = [f"| N | model | {cols} | {idle} |", "|---|---|" + "---:|" * 8]
    for r in doc["sweep"]:
        lines.append(f"| {r['size']}->{r['size'] + 1} | {r['model']} | "
                     + " | ".join(_f(r["delay_s"][s]) for s in STRATEGIES) + " | "
                     + " | ".join(_f(r["idle_s"][s], 1) for s in STRATEGIES) + " |")
    return lines


def broker_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["| N | all-to-all deliveries/s | core busy | O(N) deliveries/s | core busy | "
             "O(N) + churn | snapshot KiB |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in doc["broker"]:
        a, o = r["all-to-all"], r["leader-only"]
        lines.append(f"| {r['nodes']} | {a['deliveries_per_s']:,.0f} | {a['utilisation']:.1%} | "
                     f"{o['deliveries_per_s']:,.0f} | {o['utilisation']:.1%} | "
                     f"{o['utilisation_churn']:.1%} | {r['snapshot_bytes'] / 1024:,.0f} |")
    s = doc["saturation"]
    lines += ["", f"One broker core at {s['service_rate_hb_per_s']:,.0f} heartbeat deliveries/s "
              f"saturates at N = {s['all-to-all']['nodes']:,} (all-to-all) and "
              f"N = {s['leader-only']['nodes']:,} (O(N)); with {s['churn_per_node_h']:g} "
              f"membership changes per node-hour, each a snapshot to every node: "
              f"{s['all-to-all']['nodes_with_churn']:,} and "
              f"{s['leader-only']['nodes_with_churn']:,}. The snapshot exceeds the daemon's "
              f"{s['max_payload_bytes'] // 1024} KiB payload limit from N = "
              f"{s['snapshot_limit_nodes']:,}."]
    return lines


def failover_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["| N | fault | pattern | broker busy | detect s | elected s | all follow s | "
             "first snapshot to all s |", "|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in doc["failover"]:
        snap = _f(r["snapshot_fanout_s"], 3) + (" (over the limit)" if r["snapshot_over_limit"]
                                                 else "")
        if r["saturated"]:
            lines.append(f"| {r['nodes']} | {r['fault']} | {r['pattern']} | {r['rho']:.0%} | "
                         "saturated | - | - | - |")
            continue
        lines.append(f"| {r['nodes']} | {r['fault']} | {r['pattern']} | {r['rho']:.1%} | "
                     f"{_f(r.get('detect_s'), 3)} | {_f(r.get('elected_s'), 3)} | "
                     f"{_f(r.get('followed_s'), 3)} | {snap} |")
    return lines


def churn_lines(doc: dict[str, Any]) -> list[str]:
    lines = ["| N at start | simulated s | joins | leaves | failures | members at end | "
             "scale-outs done | delay median s | max s | snapshots | largest snapshot KiB | "
             "churn deliveries/s | churn MB/s | broker busy (O(N) + churn) | run CPU s |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    cpu = doc.get("measured", {}).get("churn_run_cpu_s", {})
    for r in doc.get("churn", []):
        d, e = r["scale_out_delay_s"], r["events"]
        lines.append(f"| {r['nodes']} | {r['seconds']:g} | {e['join']} | {e['leave']} | "
                     f"{e['fail']} | {r['members_end']} | {r['scale_outs']} | "
                     f"{_f(d['median'])} | {_f(d['max'])} | {r.get('snapshots', '-')} | "
                     f"{_f(_kib(r.get('snapshot_bytes_max')), 1)} | "
                     f"{r['churn_deliveries_per_s']:.1f} | {r['churn_bytes_per_s'] / 1e6:.2f} | "
                     f"{r['broker_busy']:.2%} | {_f(cpu.get(str(r['nodes'])), 1)} |")
    return lines


def markdown(doc: dict[str, Any]) -> str:
    parts = ["# chaosctl bench simulate", "",
             "## In-sample replay of the netns testbed (a regression check)", "",
             *validation_lines(doc), "", "## Out of sample: a fresh testbed run predicted", "",
             *holdout_lines(doc), "", "## Scale-out against N (medians; s, idle node-s)", "",
             *sweep_lines(doc), "", "## Broker load", "", *broker_lines(doc), "",
             "## Failover", "", *failover_lines(doc), "",
             "## Poisson churn through the real scheduler", "", *churn_lines(doc), "",
             "## The real scheduler's policy step (measured CPU on this machine)", "",
             "| members | CPU s per policy |", "|---:|---:|",
             *(f"| {n} | {v:.3f} |" for n, v in doc.get("measured", {}).get(
                 "policy_cpu_s", {}).items()), ""]
    return "\n".join(parts)


def draw(plt: Any, doc: dict[str, Any]) -> Any:
    """The Fig. 7 and Fig. 10 trends and the broker's load."""
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    model = doc["meta"]["models"][0]
    rows = [r for r in doc["sweep"] if r["model"] == model]
    xs = [r["size"] for r in rows]
    for s in STRATEGIES:
        axes[0].plot(xs, [r["delay_s"][s] for r in rows], marker="o", label=s)
        axes[1].plot(xs, [max(r["idle_s"][s], 1e-3) for r in rows], marker="o", label=s)
    axes[0].set(xscale="log", yscale="log", xlabel="existing nodes N",
                ylabel="scale-out delay, s",
                title=f"Fig. 7 trend ({model}, simulated)")
    axes[1].set(xscale="log", yscale="log", xlabel="existing nodes N",
                ylabel="cluster idle, node-s", title=f"Fig. 10 trend ({model}, simulated)")
    ns = [r["nodes"] for r in doc["broker"]]
    for p in PATTERNS:
        axes[2].plot(ns, [r[p]["deliveries_per_s"] for r in doc["broker"]], marker="o",
                     label=f"{p} heartbeats")
    axes[2].axhline(doc["saturation"]["service_rate_hb_per_s"], color="grey", ls="--",
                    label="one mosquitto core")
    axes[2].set(xscale="log", yscale="log", xlabel="nodes N", ylabel="deliveries/s",
                title="broker load")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    return fig


def write(output: Output, doc: dict[str, Any]) -> None:
    """``simulate.json``, ``simulate.md`` and ``simulate.png``."""
    output.json("simulate.json", doc)
    output.text("simulate.md", markdown(doc))
    output.figure("simulate.png", lambda plt: draw(plt, doc))


def tables(doc: dict[str, Any]) -> list[Table]:
    """Rich tables: validation summary, the sweep, broker saturation."""
    out = []
    if doc.get("validation"):
        t = Table(title="In sample (a regression check): the testbed replayed")
        for c in ("strategy", "metric", "points", "median |err|", "max |err|", "within 15%"):
            t.add_column(c, justify="left" if c in ("strategy", "metric") else "right")
        for r in doc["validation"]["summary"]:
            t.add_row(r["strategy"], r["metric"], str(r["points"]),
                      f"{r['median_abs_err']:.1%}", f"{r['max_abs_err']:.1%}",
                      f"{r['within']}/{r['points']}")
        out.append(t)
    if doc.get("holdout"):
        t = Table(title="Out of sample: a fresh testbed run predicted from configured rates "
                        "(unique points)")
        for c in ("strategy", "metric", "points", "median |err|", "max |err|", "within 15%"):
            t.add_column(c, justify="left" if c in ("strategy", "metric") else "right")
        for r in doc["holdout"]["unique"]:
            t.add_row(r["strategy"], r["metric"], str(r["points"]), _pct(r["median_abs_err"]),
                      _pct(r["max_abs_err"]), f"{r['within']}/{r['points']}")
        for g in doc["holdout"]["groups"]:
            t.add_row(f"all {g['group']}", "", str(g["points"]), _pct(g["median_abs_err"]),
                      _pct(g["max_abs_err"]), f"{g['within']}/{g['points']}")
        out.append(t)
    t = Table(title="Scale-out against N (medians; delay s, idle node-s)")
    t.add_column("N", justify="right")
    t.add_column("model")
    for s in STRATEGIES:
        t.add_column(f"{SHORT[s]} s", justify="right")
    for s in STRATEGIES:
        t.add_column(f"idle {SHORT[s]}", justify="right")
    for r in doc["sweep"]:
        t.add_row(str(r["size"]), r["model"], *(_f(r["delay_s"][s]) for s in STRATEGIES),
                  *(_f(r["idle_s"][s], 1) for s in STRATEGIES))
    out.append(t)
    t = Table(title="Broker (one mosquitto core) and failover")
    for c in ("N", "all-to-all del/s", "busy", "O(N) del/s", "busy", "kill9 elected s",
              "sigstop elected s"):
        t.add_column(c, justify="right")
    fo = {(r["nodes"], r["fault"]): r for r in doc["failover"] if r["pattern"] == "leader-only"}
    for r in doc["broker"]:
        a, o = r["all-to-all"], r["leader-only"]
        t.add_row(f"{r['nodes']:,}", f"{a['deliveries_per_s']:,.0f}", f"{a['utilisation']:.0%}",
                  f"{o['deliveries_per_s']:,.0f}", f"{o['utilisation']:.1%}",
                  _f(fo[(r["nodes"], "kill9")].get("elected_s"), 3),
                  _f(fo[(r["nodes"], "sigstop")].get("elected_s"), 3))
    out.append(t)
    return out
