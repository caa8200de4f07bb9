"""Validation: replay the netns testbed's scale-out instances and compare, point by point.

``chaosctl bench scaleout`` records each instance it built (topology, tbf rates, the rates
iperf3 measured on the new node's links one at a time and, since commit 739c1fa, all at once,
routes) and, per model and strategy, the delay and the idle time it measured. Here the same
instances run in the simulation: the neighbour links at their measured rates, the other links
at their tbf rate times the goodput ratio iperf3 saw on the neighbour links alone
(``efficiency``), the same state shapes, the same strategies. Where the testbed measured the
links all at once, a neighbour link sends at that rate while another neighbour link is busy
(the namespaces share the box's two cores, so together the links deliver less than each
alone), and the planners see those rates, as the testbed's joining node did. The costs
that are not the network's (:class:`~chaos_bench.sim.scaleout.Costs`: disk, restart, plan,
connect) are fitted from the testbed's own phase timings (medians), so ``stop-resume`` is
in-sample by construction and says only that its phases add up; the network strategies are
predictions.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from chaos_bench.models import tensor_sizes
from chaos_bench.sim.errors import SimError
from chaos_bench.sim.network import MBIT, key
from chaos_bench.sim.scaleout import STRATEGIES, Costs, simulate
from chaos_bench.sim.topology import Instance

DEFAULT_TESTBED = Path("bench/results/scaleout-testbed-stop3/scaleout.json")
TOLERANCE = 0.15


def load(path: Path) -> dict[str, Any]:
    """The testbed's JSON, checked for what the replay needs.

    Raises:
        SimError: Missing, unreadable, or not a ``bench scaleout`` result with instances.
    """
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise SimError(f"no testbed results at {path}: run `chaosctl bench scaleout` "
                       "first or pass --testbed FILE") from None
    except (OSError, ValueError) as exc:
        raise SimError(f"cannot read testbed results {path}: {exc}") from None
    if not isinstance(doc, dict) or not doc.get("instances"):
        raise SimError(f"{path} has no 'instances': not a `chaosctl bench scaleout` result")
    return doc


def efficiency(doc: Mapping[str, Any]) -> float:
    """Median goodput over tbf rate on the new nodes' links (iperf3 against configured)."""
    ratios = []
    for inst in doc["instances"]:
        for n, mbps in inst["measured_mbps"].items():
            cfg = inst["configured_mbps"].get("-".join(sorted((n, inst["new"]),
                                                               key=lambda x: int(x[1:]))))
            if cfg:
                ratios.append(mbps / cfg)
    return statistics.median(ratios) if ratios else 0.956


def calibrate(doc: Mapping[str, Any]) -> Costs:
    """The non-network costs, as medians of the testbed's measured phases."""
    mib = doc["meta"]["mib"]
    write: list[float] = []
    read: list[float] = []
    verify: list[float] = []
    restart: list[float] = []
    plan: list[float] = []
    connect: list[float] = []
    for inst in doc["instances"]:
        for model, res in inst["models"].items():
            nbytes = mib[model] * (1 << 20)
            ph = res["stop-resume"]["phases"]
            write.append(nbytes / ph["write_fsync"])
            read.append(nbytes / ph["read"])
            verify.append(nbytes / ph["verify"])
            restart.append(ph["restart"])
            plan.append(res["chaos"]["decision_s"])
            for strat in ("chaos", "multi-source"):  # the k-th source starts at ~k x connect
                firsts = [s[0] for s in res[strat]["sources"].values() if s[0] is not None]
                connect.append(max(firsts) / len(firsts))
    med = statistics.median
    return Costs(plan_s=med(plan), connect_s=med(connect), disk_write_bps=med(write),
                 disk_read_bps=med(read), verify_bps=med(verify), restart_s=med(restart))


def instance(raw: Mapping[str, Any], eff: float) -> Instance:
    """A recorded testbed instance as the simulation's :class:`Instance`."""
    new = raw["new"]
    rates = {}
    for name, mbps in raw["configured_mbps"].items():
        a, b = name.split("-")
        rates[key(a, b)] = mbps * MBIT * eff
    alone = {n: m * MBIT for n, m in raw["measured_mbps"].items()}
    for n, r in alone.items():
        rates[key(n, new)] = r
    # Recorded since commit 739c1fa; the testbed's planners see these rates.
    together = {n: m * MBIT for n, m in raw.get("concurrent_mbps", {}).items()}
    routes = {n: tuple(p) for n, p in raw["routes"].items()}
    return Instance(int(raw["size"]), new, tuple(raw["neighbours"]), rates,
                    together or alone, routes, together)


def _err(sim: float, real: float) -> float:
    return (sim - real) / real if real > 0 else 0.0


def replay(doc: Mapping[str, Any], costs: Costs | None = None,
           sizes: list[int] | None = None) -> dict[str, Any]:
    """Every recorded point (instance x model x strategy): testbed, simulated, error."""
    eff = efficiency(doc)
    costs = costs or calibrate(doc)
    points = []
    for raw in doc["instances"]:
        if sizes is not None and int(raw["size"]) not in sizes:
            continue
        inst = instance(raw, eff)
        for model, res in sorted(raw["models"].items()):
            segments = tensor_sizes(model)
            for strat in STRATEGIES:
                real = res[strat]
                idle_real = _real_idle(real, inst.size)
                out = simulate(inst, strat, segments, costs)
                points.append({
                    "size": inst.size, "model": model, "strategy": strat,
                    "delay_real_s": real["delay_s"], "delay_sim_s": out.delay_s,
                    "delay_err": _err(out.delay_s, real["delay_s"]),
                    "idle_real_s": idle_real, "idle_sim_s": out.idle_s,
                    "idle_err": _err(out.idle_s, idle_real),
                })
    return {"efficiency": eff, "costs": costs.__dict__, "points": points,
            "summary": summarise(points)}


def _real_idle(res: Mapping[str, Any], size: int) -> float:
    """The testbed's idle definition applied to its own record (see the module doc)."""
    if res["strategy"] in ("single", "stop-resume"):
        return size * float(res["delay_s"])
    return sum(float(s["busy_s"]) for s in res["servers"].values())


def summarise(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per strategy and metric: median |error|, worst, and how many points are within 15%."""
    rows = []
    for strat in STRATEGIES:
        for metric in ("delay", "idle"):
            errs = [abs(p[f"{metric}_err"]) for p in points if p["strategy"] == strat]
            if not errs:
                continue
            rows.append({"strategy": strat, "metric": metric, "points": len(errs),
                         "median_abs_err": statistics.median(errs), "max_abs_err": max(errs),
                         "within": sum(e <= TOLERANCE for e in errs)})
    return rows
