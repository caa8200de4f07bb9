"""``chaosctl bench check``: rerun the quick version of each headline bench and hold it against
the committed results, so that a regression shows.

``chaosctl bench check [--only planner,simulate,allreduce] [--results bench/results]
[--tolerance 0.15] [--out check]``

Each guard reads its committed figure from ``--results`` (a checkout's ``bench/results``; the
installed package ships none), reruns the quick version of the bench and compares the two.
A figure passes when it is no worse than its floor: the committed figure, less the tolerance
for a timing, exactly for a deterministic figure, or a proven limit (a planner can never beat
the water-filling bound):

- ``planner`` (deterministic): on the issue's star, the default plan's makespan over the
  water-filling bound, and Algorithms 1+2's makespan over the default's; over fresh random
  neighbour sets of every state shape, the default plan's worst makespan over the bound (at
  most 1: it is the exact optimum).
- ``simulate`` (deterministic): the simulator replays the committed testbed scale-outs; the
  number of network-strategy points within 15% of the testbed, delay and idle. The constants
  are fitted on those same runs, so this is an in-sample regression check, not a validation;
  ``stop-resume`` matches by construction and is left out.
- ``allreduce`` (timing): Chaos's all-reduce over the best gloo on loopback (4 processes,
  100 MB, the centre tree, fp32, auto chunks), 5 repeats against the median of the committed
  fair runs. It takes about a minute and depends on the box, so CI does not run it.
- ``mesh`` (timing, root): the committed shaped mesh built again (4 network namespaces, tbf on
  every veth), star and uniform, 20 MB, 3 repeats of each kind; Chaos's spanning tree over the
  best gloo, and over its own link bound, against the committed runs' medians (the star's
  12x is the feature, the uniform mesh's 1.2x the case without a fast hub). About two
  minutes.
- ``scaleout`` (timing, root): the committed star (200/400/800 Mbit/s, tbf in network
  namespaces) built again, and one repeat of every strategy pulling ResNet101 (where Chaos is
  furthest from the bound) and GPT-2; Chaos's delay over the water-filling bound, against the
  committed medians plus the tolerance. About two minutes.

- ``stall`` (timing): Chaos's own share of an unchanged training step of the CNN (the stall
  less the optimizer's step), p50, on a chain of 4 real chaosd and workers with 10 events of
  each kind, 1 s apart as in the committed run; about a minute and a half.
- ``slowlinks`` (no network, held to the tolerance): DiLoCo's validation loss at each
  committed H with the outer learning rate and momentum the bench chose, rerun in one
  process on the tuning seeds (about 20 s). Float kernels differ between CPUs, so it is not
  held exactly.

- ``convergence`` (training): the short convergence run again (each model of the committed
  run, the CNN and the char transformer, on 2 and 3 chaosd, static and through a scale-out
  and a scale-in); each run's final validation loss against the committed short run's, held
  to the slack of its model (``CONVERGENCE_SLACK``: the CNN's short run moves by up to 27%
  between runs, so 30%, which catches a broken average, not a small drift; the char
  transformer's by 0.1%, so the tolerance), and the step accounting exactly (no step lost
  or doubled, every member equal). About 90 s.
- ``throughput`` (timing, root): the committed heterogeneous mesh (3 network namespaces, each
  link at its committed rate) built again; one repeat of torch DDP over gloo and of
  ``chaos_edge.ddp`` on chartf; the steps/s ratio against the committed median. About two
  minutes.

Prints a table and writes ``check.json`` under ``--out`` (and the all-reduce rerun's own JSON
under ``--out``/allreduce); exits 1 when a figure regressed.
"""

from __future__ import annotations

import json
import random
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

from rich.table import Table

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaosctl.client import CtlError

GUARDS = ("planner", "simulate", "allreduce", "mesh", "scaleout", "stall", "slowlinks",
          "convergence", "throughput")
#: The throughput headline: chartf on the committed heterogeneous mesh, DDP against the DDP
#: path (the arm a DDP user runs), one repeat of each.
THROUGHPUT_SOURCE = "throughput/chartf-3-netns-5-50mbit/throughput.json"
THROUGHPUT_ARM = "chaos-ddp"
MESH_REPEATS = 3  # of each kind, per shape: about a minute each
MESH_TREE = "chaos/spanning"  # the rate-aware tree; the chain is the rate-blind control
STALL_EVENTS = 10  # of each kind: about a minute
#: How far a model's short convergence run moves between runs on one quiet box, so what it
#: is held to (or --tolerance, where that is larger). The CNN: static-2's validation loss read
#: 0.66, 0.72, 0.81, 0.64 and 0.69 in five runs (consistent mode splits each batch by
#: measured speed), so 30%. The char transformer: 3.060-3.064 in all eight runs of two
#: short benches, so the tolerance.
CONVERGENCE_SLACK = {"cnn": 0.3}
STALL_GAP_S = 1.0  # between events, as committed (at 0.3 s one try read 0.94 ms, at 1 s 0.71)
SCALEOUT_MODELS = ("resnet101", "gpt2")  # the star's worst ratio, and a typical one
#: Those that are deterministic: the same code gives the same figure on any box (CI runs them).
DETERMINISTIC = ("planner", "simulate")
#: A proven limit is held to this much float noise, and a deterministic figure to this much.
EXACT = 1e-6


@dataclass(frozen=True)
class Verdict:
    """One headline figure: committed, now, and the worst value accepted."""

    guard: str
    headline: str
    source: str  # the committed file, relative to --results
    committed: float
    now: float
    floor: float  # the worst value that passes
    higher_is_better: bool
    note: str = ""

    @property
    def ok(self) -> bool:
        return self.now >= self.floor if self.higher_is_better else self.now <= self.floor


def _read(results: Path, rel: str) -> dict[str, Any]:
    """A committed JSON document.

    Raises:
        CtlError: Missing or unreadable.
    """
    path = results / rel
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise CtlError(f"no committed result {path}: run from a checkout, or pass --results "
                       "DIR") from None
    except (OSError, ValueError) as exc:
        raise CtlError(f"cannot read committed result {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise CtlError(f"{path} is not a bench result (not a JSON object)")
    return doc


def _exact(guard: str, headline: str, source: str, committed: float, now: float,
           higher: bool) -> Verdict:
    """A deterministic figure: it may improve, not regress beyond float noise."""
    slack = EXACT * max(abs(committed), 1.0)
    return Verdict(guard, headline, source, committed, now,
                   committed - slack if higher else committed + slack, higher)


def check_planner(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """The star's two ratios (exact) and the bound over fresh random instances."""
    from chaos_bench.planner import run as planner

    source = "planner/planner_bench.json"
    doc = _read(results, source)
    try:
        star, shapes = doc["star"], doc["shapes"]
        then_lb = star["chaos"]["makespan_s"] / star["lower_bound_s"]
        then_paper = star["paper"]["makespan_s"] / star["chaos"]["makespan_s"]
        then_max = max(s["chaos_over_lb"]["max"] for s in shapes)
    except (KeyError, TypeError, ValueError, ZeroDivisionError) as exc:
        raise CtlError(f"{results / source}: not a planner bench result ({exc!r})") from None
    say("planner: the star, and the quick neighbour sets of every state shape")
    now_star = planner.bench_star()
    now_shapes = planner.bench_shapes(True, random.Random(doc.get("seed", 2024)))
    now_max = max(s["chaos_over_lb"]["max"] for s in now_shapes)
    return [
        _exact("planner", "star: chaos makespan / water-filling bound", source, then_lb,
               now_star["chaos"]["makespan_s"] / now_star["lower_bound_s"], higher=False),
        _exact("planner", "star: Algorithms 1+2 makespan / chaos", source, then_paper,
               now_star["paper"]["makespan_s"] / now_star["chaos"]["makespan_s"], higher=True),
        Verdict("planner", "every shape: worst chaos makespan / bound", source, then_max,
                now_max, 1.0 + EXACT, higher_is_better=False,
                note="a bound: at most 1 (fresh instances, so not the committed ones)"),
    ]


def _within(summary: list[dict[str, Any]]) -> tuple[int, int]:
    """Points within the tolerance, and points, of the network strategies."""
    rows = [r for r in summary if r["strategy"] != "stop-resume"]
    return sum(int(r["within"]) for r in rows), sum(int(r["points"]) for r in rows)


def check_simulate(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """The simulator's replay of the committed testbed runs (in sample)."""
    from chaos_bench.sim import validate

    source, testbed = "simulate/simulate.json", "scaleout-testbed-stop3/scaleout.json"
    doc = _read(results, source)
    try:
        then, points = _within(doc["validation"]["summary"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CtlError(f"{results / source}: not a simulate result ({exc!r})") from None
    say(f"simulate: replaying {testbed}")
    now, now_points = _within(validate.replay(validate.load(results / testbed))["summary"])
    verdict = _exact("simulate", f"network-strategy points within 15% of the testbed, of "
                     f"{points}", source, then, now, higher=True)
    return [replace(verdict, note=f"in sample: a regression check ({now_points} points now)")]


def check_allreduce(results: Path, tolerance: float, out: Path, say: Say
                    ) -> list[Verdict]:
    """Chaos over the best gloo on loopback, against the committed fair runs' median (the
    rerun's own JSON under ``out/allreduce``)."""
    from chaos_bench.allreduce import run as allreduce

    runs = sorted((results / "allreduce-fair").glob("run-*/allreduce_bench.json"))
    if not runs:
        raise CtlError(f"no committed result {results / 'allreduce-fair'}/run-*: run from a "
                       "checkout, or pass --results DIR")
    source = "allreduce-fair/run-*/allreduce_bench.json"
    rel = [str(p.relative_to(results)) for p in runs]
    try:
        then = statistics.median(_read(results, r)["results"][0]["ratios"]["chaos/centre"]
                                 for r in rel)
    except (KeyError, IndexError, TypeError) as exc:
        raise CtlError(f"{results / source}: not an allreduce bench result ({exc!r})") from None
    opts = {"networks": ["loopback"], "mb": 100, "nodes": 4, "repeats": 5, "chunk_kbs": [0],
            "results": ["reuse"], "trees": ["centre"], "wires": ["fp32"], "samples": 1,
            "sock_buf": 0}
    doc = allreduce.run(opts, out / "allreduce", say)
    now = doc["results"][0]["ratios"]["chaos/centre"]
    return [Verdict("allreduce", "loopback: chaos / best gloo, medians", source, then, now,
                    then * (1 - tolerance), higher_is_better=True,
                    note=f"median of {len(runs)} committed runs; 5 repeats now")]


def check_mesh(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """On each committed mesh shape, Chaos's spanning tree over the best gloo and over its link
    bound, against the committed runs' medians (the rerun's own JSON under ``out/mesh``)."""
    from chaos_bench.allreduce import run as allreduce

    runs = sorted((results / "allreduce-mesh-fair").glob("run-*/allreduce_bench.json"))
    if not runs:
        raise CtlError(f"no committed result {results / 'allreduce-mesh-fair'}/run-*: run "
                       "from a checkout, or pass --results DIR")
    source = "allreduce-mesh-fair/run-*/allreduce_bench.json"
    docs = [_read(results, str(p.relative_to(results))) for p in runs]
    try:
        opts = dict(docs[0]["options"])
        shapes = list(opts["mesh_shapes"])
        then = {(shape, what): statistics.median(_mesh_figures(d, shape)[what] for d in docs)
                for shape in shapes for what in ("ratio", "over_bound")}
    except (KeyError, IndexError, TypeError, ValueError) as exc:
        raise CtlError(f"{results / source}: not a mesh all-reduce result ({exc!r})") from None
    opts.update(networks=["mesh"], repeats=MESH_REPEATS)
    say(f"mesh: {', '.join(shapes)}, {opts['mesh_mb']} MB, {MESH_REPEATS} repeats of each kind")
    doc = allreduce.run(opts, out / "mesh", say)
    verdicts = []
    for shape in shapes:
        now = _mesh_figures(doc, shape)
        note = f"median of {len(docs)} committed runs; {MESH_REPEATS} repeats now"
        verdicts += [
            Verdict("mesh", f"{shape}: chaos spanning tree / best gloo, medians", source,
                    then[shape, "ratio"], now["ratio"],
                    then[shape, "ratio"] * (1 - tolerance), higher_is_better=True, note=note),
            Verdict("mesh", f"{shape}: chaos spanning tree / its link bound", source,
                    then[shape, "over_bound"], now["over_bound"],
                    then[shape, "over_bound"] * (1 + tolerance), higher_is_better=False,
                    note=note)]
    return verdicts


def _mesh_figures(doc: dict[str, Any], shape: str) -> dict[str, float]:
    """The spanning tree's ratio to the best gloo, and its time over its link bound, on one
    mesh shape of an all-reduce result.

    Raises:
        KeyError: The result has no such shape or row.
    """
    for res in doc["results"]:
        if res["network"] == "mesh" and res["shape"] == shape:
            row = next((r for r in res["rows"] if r["kind"] == MESH_TREE), None)
            if row is None:
                raise KeyError(f"{shape}: no {MESH_TREE} row")
            return {"ratio": float(res["ratios"][MESH_TREE]),
                    "over_bound": float(row["over_bound"])}
    raise KeyError(f"mesh shape {shape}")


def check_scaleout(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """Chaos over the water-filling bound on the committed star, one repeat now (the rerun's
    own results under ``out/scaleout``)."""
    from chaos_bench.scaleout import run as scaleout

    source = "scaleout-star-bound/scaleout.json"
    doc = _read(results, source)
    try:
        star = [float(r) for r in doc["meta"]["star_mbps"]]
        rows = {r["model"]: r for r in doc["rows"]}
        then = {m: float(rows[m]["chaos_over_lb_achievable"]) for m in SCALEOUT_MODELS}
        repeats = int(doc["meta"]["repeats"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CtlError(f"{results / source}: not a star scale-out result ({exc!r})") from None
    if not star:
        raise CtlError(f"{results / source}: not a star scale-out result (no star rates)")
    now_doc = scaleout.run([], list(SCALEOUT_MODELS), 1, (min(star), max(star)),
                           out / "scaleout", say, star=star)
    now = {r["model"]: float(r["chaos_over_lb_achievable"]) for r in now_doc["rows"]}
    return [Verdict("scaleout", f"star, {m}: chaos / water-filling bound", source, then[m],
                    now[m], then[m] * (1 + tolerance), higher_is_better=False,
                    note=f"median of {repeats} committed repeats; 1 repeat now")
            for m in SCALEOUT_MODELS]


def check_stall(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """Chaos's own share of an unchanged step of the CNN (the stall less the optimizer's
    step), p50, against the committed run; 10 events of each kind now (its own JSON under
    ``out/stall``)."""
    from chaos_bench.stall import run as stall

    source = "stall-cnn/stall.json"
    doc = _read(results, source)
    try:
        then = float(doc["baseline"]["framework"]["p50_ms"])
        steps = int(doc["baseline"]["steps"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CtlError(f"{results / source}: not a stall bench result ({exc!r})") from None
    now_doc, _ = stall.run(4, STALL_EVENTS, STALL_GAP_S, out / "stall", None, None, say,
                           model="cnn")
    now = float(now_doc["baseline"]["framework"]["p50_ms"])
    return [Verdict("stall", "cnn: Chaos's own ms of an unchanged step, p50", source, then,
                    now, then * (1 + tolerance), higher_is_better=False,
                    note=f"p50 of {steps} committed steps; {now_doc['baseline']['steps']} now")]


def check_slowlinks(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """DiLoCo's validation loss at each committed H with its chosen outer optimizer, rerun in
    one process on the tuning seeds (no network: the same figure on any box, up to the float
    rounding of the CPU's kernels, so it is held to the tolerance, not exactly)."""
    from chaos_bench.slowlinks import tune
    from chaos_bench.slowlinks.task import Digits

    source = "slowlinks-fair/slowlinks.json"
    doc = _read(results, source)
    try:
        opts = doc["options"]
        chosen = doc["tuning"]["outer"]["chosen"]
        points = {(p["inner_steps"], p["outer_lr"], p["outer_momentum"]): p
                  for p in doc["tuning"]["outer"]["points"]}
        then = {int(h): points[(int(h), c["outer_lr"], c["outer_momentum"])]
                for h, c in chosen.items()}
    except (KeyError, TypeError, ValueError) as exc:
        raise CtlError(f"{results / source}: not a tuned slow-links result ({exc!r})") from None
    say(f"slowlinks: DiLoCo at H={', '.join(str(h) for h in then)} on the validation split")
    data = Digits.load()
    verdicts = []
    for h, p in then.items():
        losses = [tune.simulate(h, p["outer_lr"], p["outer_momentum"], seed,
                                steps=int(opts["steps"]), nodes=int(opts["nodes"]),
                                batch=int(opts["batch"]), lr=float(opts["lr"]), data=data)[0]
                  for seed in tune.TUNE_SEEDS]
        now = statistics.fmean(losses)
        verdicts.append(Verdict(
            "slowlinks", f"diloco H={h}: validation loss (outer lr {p['outer_lr']:g}, "
            f"momentum {p['outer_momentum']:g})", source, float(p["mean_loss"]), now,
            float(p["mean_loss"]) * (1 + tolerance), higher_is_better=False,
            note=f"mean of {len(losses)} tuning seeds, in one process"))
    return verdicts


def check_convergence(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """The short convergence run again (each committed model, 2 <-> 3 chaosd, consistent
    mode): each run's final validation loss against the committed short run's, and its step
    accounting (no step lost or doubled, every member equal) exactly (the rerun's JSON under
    ``out/convergence``)."""
    from chaos_bench.convergence import run as convergence

    source = "convergence-short/convergence.json"
    doc = _read(results, source)
    try:
        then = {m: {k: float(r["final"]["val_loss"]) for k, r in d["runs"].items()}
                for m, d in doc["models"].items()}
        seed, nodes = int(doc["seed"]), int(doc["nodes"])
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CtlError(f"{results / source}: not a short convergence result ({exc!r})") from None
    unknown = sorted(set(then) - set(convergence.SHORT))
    if not then or unknown:
        raise CtlError(f"{results / source}: models {unknown or 'none'} are not ones the "
                       "short bench runs")
    models = list(then)
    now_doc = convergence.run(models, nodes, ["consistent"], True, None, None, seed,
                              out / "convergence", None, say)
    verdicts: list[Verdict] = []
    problems = 0
    for model in models:
        runs = now_doc["models"][model]["runs"]
        slack = max(tolerance, CONVERGENCE_SLACK.get(model, 0.0))
        for key, loss in then[model].items():
            if key not in runs:
                raise CtlError(f"{results / source}: run {model} {key} is not one the short "
                               "bench runs")
            verdicts.append(Verdict("convergence", f"{model} {key}: final validation loss",
                                    source, loss, float(runs[key]["final"]["val_loss"]),
                                    loss * (1 + slack), higher_is_better=False,
                                    note=f"1 run each; held to {slack:.0%}"))
        problems += sum(len(r["problems"]) for r in runs.values())
    verdicts.append(Verdict("convergence", "step accounting: problems over every run", source,
                            0.0, float(problems), 0.0, higher_is_better=False,
                            note="exactly none: no step lost or doubled, members equal"))
    return verdicts


def check_throughput(results: Path, tolerance: float, out: Path, say: Say) -> list[Verdict]:
    """The committed heterogeneous mesh built again (its rates, seed 1), one repeat of DDP and
    of the DDP path; the ratio against the committed median (the rerun's JSON under
    ``out/throughput``)."""
    from chaos_bench.throughput import run as throughput

    doc = _read(results, THROUGHPUT_SOURCE)
    try:
        then = float(doc["summary"][THROUGHPUT_ARM]["vs_ddp"]["median"])
        args = (doc["model"], int(doc["nodes"]), int(doc["batch"]), int(doc["warmup"]),
                int(doc["steps"]))
        lo, hi = float(doc["mbit"]), float(doc["mbit_max"])
    except (KeyError, TypeError, ValueError) as exc:
        raise CtlError(f"{results / THROUGHPUT_SOURCE}: not a netns throughput result "
                       f"({exc!r})") from None
    say(f"throughput: {args[0]} on the {lo:g}-{hi:g} Mbit/s mesh, ddp and {THROUGHPUT_ARM}")
    now = throughput.run(*args, 1, ["ddp", THROUGHPUT_ARM], out / "throughput", None, say,
                         mbit=lo, mbit_max=hi)
    ratio = float(now["summary"][THROUGHPUT_ARM]["vs_ddp"]["median"])
    return [Verdict("throughput", f"{args[0]}, {lo:g}-{hi:g} Mbit/s mesh: {THROUGHPUT_ARM} / "
                    "ddp steps/s", THROUGHPUT_SOURCE, then, ratio, then * (1 - tolerance),
                    higher_is_better=True,
                    note=f"median of {len(doc['repeats'])} committed repeats; 1 repeat now")]


CHECKS: dict[str, Callable[[Path, float, Path, Say], list[Verdict]]] = {
    "planner": check_planner, "simulate": check_simulate, "allreduce": check_allreduce,
    "mesh": check_mesh, "scaleout": check_scaleout, "stall": check_stall,
    "slowlinks": check_slowlinks, "convergence": check_convergence,
    "throughput": check_throughput}


def run(only: list[str], results: Path, tolerance: float, out: Path, say: Say
        ) -> dict[str, Any]:
    """Every guard of ``only``; writes ``check.json`` and returns it.

    Raises:
        CtlError: A committed result is missing or unreadable, or a bench failed.
    """
    if not results.is_dir():
        raise CtlError(f"no committed results at {results}: run from a checkout, or pass "
                       "--results DIR")
    verdicts: list[Verdict] = []
    for name in only:
        verdicts += CHECKS[name](results, tolerance, out, say)
    doc = {"results": str(results), "tolerance": tolerance, "guards": only,
           "verdicts": [{**asdict(v), "ok": v.ok} for v in verdicts],
           "regressed": [v.headline for v in verdicts if not v.ok]}
    Output(out, say).json("check.json", doc)
    return doc


def table(doc: dict[str, Any]) -> Table:
    """A line per headline: committed, now, the floor, and the verdict."""
    t = Table(title=f"Headlines against {doc['results']} (timings: tolerance "
                    f"{doc['tolerance']:.0%})")
    for col in ("guard", "headline", "committed", "now", "accepted", "verdict", "note"):
        t.add_column(col, justify="right" if col in ("committed", "now", "accepted") else "left")
    for v in doc["verdicts"]:
        t.add_row(v["guard"], v["headline"], f"{v['committed']:.6g}", f"{v['now']:.6g}",
                  f"{'>=' if v['higher_is_better'] else '<='} {v['floor']:.6g}",
                  "ok" if v["ok"] else "[red]REGRESSED[/]", v["note"])
    return t
