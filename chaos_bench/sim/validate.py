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

That replay is in sample: the costs, the goodput ratio and the neighbour rates come from the
runs it is compared with. It stays as a regression check (``bench check`` compares it
exactly). :func:`holdout` is the validation: every constant (costs, goodput ratio, how much
the neighbour links lose when busy together) is fitted on one ``bench scaleout`` run, and a
fresh run (other seeds, sizes and rates) is predicted from its *configured* tbf rates alone,
nothing it measured. Points are counted once each (``single``'s idle is N x its delay,
``stop-resume``'s delay is its idle / N: those are not points of their own), and the
strategies the model predicts (chaos, single, multi-source) apart from the one whose costs are
fitted (stop-resume).
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
            cfg = inst["configured_mbps"].get(_link(n, inst["new"]))
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


def _link(a: str, b: str) -> str:
    """The testbed's name of the link a-b (``configured_mbps``'s keys)."""
    return "-".join(sorted((a, b), key=lambda x: int(x[1:])))


def together_ratio(doc: Mapping[str, Any]) -> float:
    """Median over the new nodes' links of the rate measured all at once over the rate
    measured alone (1.0 where nothing was measured all at once)."""
    ratios = [inst["concurrent_mbps"][n] / mbps
              for inst in doc["instances"] for n, mbps in inst["measured_mbps"].items()
              if mbps > 0 and n in inst.get("concurrent_mbps", {})]
    return statistics.median(ratios) if ratios else 1.0


def instance(raw: Mapping[str, Any], eff: float, together: float | None = None) -> Instance:
    """A recorded testbed instance as the simulation's :class:`Instance`.

    ``together`` None: the new node's links at the rates iperf3 measured (alone, and all at
    once). A number: at their configured rates x ``eff``, and that x ``together`` while
    another one is busy: a prediction from the configuration alone."""
    new = raw["new"]
    rates = {}
    for name, mbps in raw["configured_mbps"].items():
        a, b = name.split("-")
        rates[key(a, b)] = mbps * MBIT * eff
    if together is not None:
        routes = {n: tuple(p) for n, p in raw["routes"].items()}
        alone = {n: rates[key(n, new)] for n in raw["neighbours"]}
        busy = {n: r * together for n, r in alone.items()}
        return Instance(int(raw["size"]), new, tuple(raw["neighbours"]), rates, busy, routes,
                        busy)
    alone = {n: m * MBIT for n, m in raw["measured_mbps"].items()}
    for n, r in alone.items():
        rates[key(n, new)] = r
    # Recorded since commit 739c1fa; the testbed's planners see these rates.
    measured = {n: m * MBIT for n, m in raw.get("concurrent_mbps", {}).items()}
    routes = {n: tuple(p) for n, p in raw["routes"].items()}
    return Instance(int(raw["size"]), new, tuple(raw["neighbours"]), rates,
                    measured or alone, routes, measured)


def _err(sim: float, real: float) -> float:
    return (sim - real) / real if real > 0 else 0.0


def replay(doc: Mapping[str, Any], costs: Costs | None = None,
           sizes: list[int] | None = None, *, eff: float | None = None,
           together: float | None = None) -> dict[str, Any]:
    """Every recorded point (instance x model x strategy): testbed, simulated, error.

    By default in sample (constants and rates from ``doc`` itself); :func:`holdout` passes
    constants fitted elsewhere and ``together`` (predict from the configured rates)."""
    eff = efficiency(doc) if eff is None else eff
    costs = costs or calibrate(doc)
    points = []
    for raw in doc["instances"]:
        if sizes is not None and int(raw["size"]) not in sizes:
            continue
        inst = instance(raw, eff, together)
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


#: Each point once: (strategy, metric); single's idle and stop-resume's delay are others x N.
UNIQUE = (("chaos", "delay"), ("chaos", "idle"), ("single", "delay"),
          ("multi-source", "delay"), ("multi-source", "idle"), ("stop-resume", "idle"))
PREDICTED = ("chaos", "single", "multi-source")  # stop-resume's costs are fitted, not predicted


def holdout(fit: Mapping[str, Any], check: Mapping[str, Any]) -> dict[str, Any]:
    """Out of sample: constants fitted on ``fit``, ``check`` predicted from its configured
    rates; the unique points' errors, predicted strategies apart from the fitted one."""
    eff, together, costs = efficiency(fit), together_ratio(fit), calibrate(fit)
    res = replay(check, costs, eff=eff, together=together)
    rows = []
    for group, strategies in (("predicted", PREDICTED), ("fitted", ("stop-resume",))):
        errs = [abs(p[f"{m}_err"]) for p in res["points"] for st, m in UNIQUE
                if st in strategies and p["strategy"] == st]
        rows.append({"group": group, "strategies": list(strategies), "points": len(errs),
                     "median_abs_err": statistics.median(errs) if errs else None,
                     "max_abs_err": max(errs) if errs else None,
                     "within": sum(e <= TOLERANCE for e in errs)})
    per = [{"strategy": st, "metric": m, **_stats(
        [abs(p[f"{m}_err"]) for p in res["points"] if p["strategy"] == st])}
        for st, m in UNIQUE]
    return {"fitted_on": {"efficiency": eff, "together_ratio": together,
                          "costs": costs.__dict__},
            "instances": len(check["instances"]),
            "sizes": sorted({int(i["size"]) for i in check["instances"]}),
            "points": res["points"], "unique": per, "groups": rows}


def _stats(errs: list[float]) -> dict[str, Any]:
    return {"points": len(errs), "median_abs_err": statistics.median(errs) if errs else None,
            "max_abs_err": max(errs) if errs else None,
            "within": sum(e <= TOLERANCE for e in errs)}
