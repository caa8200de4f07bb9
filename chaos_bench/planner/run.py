"""Planner benchmark: the default plan beside water-filling and the paper's Algorithms 1+2.

``chaosctl bench planner [--quick] [--seed N] [--models M,...] [--out DIR]``

1. Decision time for 64 neighbours and a 3 GiB state of three shapes (one tensor, 1024 equal
   tensors, GPT-2 large's tensors scaled to 3 GiB): the default ``chaos``, ``paper`` and
   ``waterfill``, timed as the ``chaos`` strategy decides (building the inputs from the tensor
   sizes, 1 MiB checksum blocks as ``align_bytes``, and planning). Median and p95.
2. Makespan over the ``waterfill`` plan's, per planner and state shape (one tensor, many equal
   tensors, the paper's models), over random edge neighbour sets of 2 to 64, with the default's
   makespan over the water-filling lower bound beside it.
3. The issue's star: three neighbours at 200, 400 and 800 Mbit/s, one 500 MiB tensor.
4. Run time of every fast planner for 2..64 neighbours on states from 1 MiB to 3 GiB: the
   paper's models (tensor shapes from the packaged ``paper_models.json``, see
   :mod:`chaos_bench.models`) and synthetic tensor lists.
5. Gap of every fast planner against the water-filling lower bound, over random neighbour sets
   on the paper's models, by number of neighbours.
6. Gap of Algorithm 2 against brute force on the same shards (the paper's Fig. 16), for
   heterogeneous and for identical neighbours, with Graham's ``4/3 - 1/(3|U|)`` next to it.

``--models`` picks the paper models of parts 2, 4 and 5 (default: all of them; ``--quick``
times only ``gpt2-large`` in part 4). Writes ``planner_bench.json`` (and ``planner_bench.png``
if matplotlib is importable) to DIR and prints markdown tables.
"""

from __future__ import annotations

import functools
import math
import random
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from chaos_bench.models import model_names, tensor_sizes
from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_edge.replication.manifest import BLOCK_SIZE
from chaos_edge.replication.planning.exact import assignment_makespan, brute_force_assign
from chaos_edge.replication.planning.greedy import greedy_assign, lpt_order
from chaos_edge.replication.planning.model import Neighbor, PlanInput
from chaos_edge.replication.planning.planner import PLANNERS
from chaos_edge.replication.planning.waterfill import lower_bound

FAST = ["chaos", "paper", "greedy", "waterfill", "even", "single"]
VS_WATERFILL = ["chaos", "paper", "greedy", "even", "single"]
MIB = 1 << 20
GIB = 1 << 30


def paper_states(names: list[str] | None = None) -> dict[str, list[int]]:
    """Tensor byte sizes (parameters, then buffers) of the paper's models (all by default)."""
    return {name: tensor_sizes(name) for name in names or model_names()}


def synthetic_state(total: int, rng: random.Random, n: int = 200) -> list[int]:
    """A tensor list of ``total`` bytes with log-uniform sizes (biases up to big matrices)."""
    weights = [math.exp(rng.uniform(0, 10)) for _ in range(n)]
    scale = total / sum(weights)
    sizes = [max(4, int(w * scale) // 4 * 4) for w in weights]
    sizes[-1] += total - sum(sizes)
    return [s for s in sizes if s > 0]


def scaled(sizes: list[int], total: int) -> list[int]:
    """``sizes`` scaled to ``total`` bytes (whole float32s; the last tensor takes the rest)."""
    f = total / sum(sizes)
    out = [max(4, int(x * f) // 4 * 4) for x in sizes]
    out[-1] += total - sum(out)
    return out


def shape_states(names: list[str] | None) -> dict[str, list[int]]:
    """The state shapes of part 2: one tensor, many equal tensors, and the paper's models."""
    states = {
        "one tensor 500 MiB": [500 * MIB],
        "one tensor 3 GiB": [3 * GIB],
        "equal 16 x 32 MiB": [32 * MIB] * 16,
        "equal 1024 x 3 MiB": [3 * MIB] * 1024,
    }
    states.update({f"model {k}": v for k, v in paper_states(names).items()})
    return states


def edge_neighbors(n: int, rng: random.Random) -> list[Neighbor]:
    """Edge links: 100 Mbit/s to 1 Gbit/s, 0.1-20 ms latency, all-reduce ending within 200 ms."""
    return [
        Neighbor(
            f"n{i}",
            rng.uniform(1e-4, 0.02),
            1.0 / rng.uniform(12.5e6, 125e6),
            rng.uniform(0.0, 0.2),
        )
        for i in range(n)
    ]


def star() -> list[Neighbor]:
    """The issue's star: three links at 200, 400 and 800 Mbit/s, no start-up delay."""
    return [Neighbor(f"n{r}", 0.0, 8 / (r * 1e6)) for r in (200, 400, 800)]


def timeit(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median and p95 wall time in ms."""
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return statistics.median(times), times[min(len(times) - 1, int(0.95 * len(times)))]


def decide(name: str, nbs: list[Neighbor], segs: list[int]) -> None:
    """What the chaos strategy does before the transfer: inputs from the tensors, then a plan."""
    PLANNERS[name](PlanInput.create(nbs, segs, BLOCK_SIZE))


def bench_decision(quick: bool, rng: random.Random) -> list[dict[str, Any]]:
    """Decision time of chaos, paper and waterfill for 64 neighbours and 3 GiB states."""
    states = {
        "one tensor": [3 * GIB],
        "1024 equal tensors": [3 * MIB] * 1024,
        "gpt2-large tensors": scaled(tensor_sizes("gpt2-large"), 3 * GIB),
    }
    nbs = edge_neighbors(64, rng)
    repeats = 21 if quick else 101
    rows = []
    for state, segs in states.items():
        row: dict[str, Any] = {"state": state, "mib": sum(segs) / MIB, "tensors": len(segs),
                               "neighbors": len(nbs)}
        for name in ("chaos", "paper", "waterfill"):
            med, p95 = timeit(functools.partial(decide, name, nbs, segs), repeats)
            row[name] = {"median_ms": med, "p95_ms": p95}
        rows.append(row)
    return rows


def bench_shapes(quick: bool, rng: random.Random,
                 names: list[str] | None = None) -> list[dict[str, Any]]:
    """Makespan / the ``waterfill`` plan's, per planner and state shape, over neighbour sets."""
    counts = [3, 8, 64] if quick else [2, 3, 4, 8, 16, 32, 64]
    trials = 2 if quick else 10
    rows = []
    for state, segs in shape_states(names).items():
        ratios: dict[str, list[float]] = {k: [] for k in [*VS_WATERFILL, "chaos_over_lb"]}
        for n in counts:
            for _ in range(trials):
                inputs = PlanInput.create(edge_neighbors(n, rng), segs, BLOCK_SIZE)
                best = PLANNERS["waterfill"](inputs).makespan_s
                for name in VS_WATERFILL:
                    ratios[name].append(PLANNERS[name](inputs).makespan_s / best)
                ratios["chaos_over_lb"].append(
                    PLANNERS["chaos"](inputs).makespan_s / lower_bound(inputs))
        rows.append({"state": state, "mib": sum(segs) / MIB, "tensors": len(segs),
                     "neighbors": counts, **{k: summary(v) for k, v in ratios.items()}})
    return rows


def bench_star() -> dict[str, Any]:
    """Every fast planner on the issue's star (makespans in seconds)."""
    inputs = PlanInput.create(star(), [500 * MIB], BLOCK_SIZE)
    out: dict[str, Any] = {"lower_bound_s": lower_bound(inputs)}
    for name in FAST:
        plan = PLANNERS[name](inputs)
        out[name] = {"makespan_s": plan.makespan_s,
                     "mib": {k: plan.bytes_of(k) / MIB for k in plan.ranges}}
    return out


def bench_runtime(quick: bool, rng: random.Random,
                  names: list[str] | None = None) -> list[dict[str, Any]]:
    """Run time of each fast planner on synthetic states and the paper's models."""
    states = {f"synthetic-{s}MiB": synthetic_state(s * MIB, rng) for s in (1, 64, 1024, 3072)}
    states.update(paper_states(names or (["gpt2-large"] if quick else None)))
    counts = [2, 8, 64] if quick else [2, 4, 8, 16, 32, 64]
    repeats = 5 if quick else 21
    rows = []
    for state, segs in states.items():
        for n in counts:
            inputs = PlanInput.create(edge_neighbors(n, rng), segs, BLOCK_SIZE)
            row: dict[str, Any] = {"state": state, "mib": sum(segs) / MIB, "neighbors": n}
            for name in FAST:
                med, p95 = timeit(functools.partial(PLANNERS[name], inputs), repeats)
                row[name] = {"median_ms": med, "p95_ms": p95}
            rows.append(row)
    return rows


def summary(values: list[float]) -> dict[str, float]:
    values = sorted(values)
    return {
        "n": len(values),
        "mean": statistics.fmean(values),
        "p50": values[len(values) // 2],
        "p95": values[min(len(values) - 1, int(0.95 * len(values)))],
        "max": values[-1],
    }


def bench_gap_lb(quick: bool, rng: random.Random,
                 names: list[str] | None = None) -> dict[str, Any]:
    """Makespan / water-filling bound of every fast planner on the paper's models."""
    models = paper_states(names)
    trials = 5 if quick else 40
    out: dict[str, Any] = {}
    for n in [2, 4, 8, 16, 64]:
        ratios: dict[str, list[float]] = {k: [] for k in FAST}
        for _ in range(trials):
            segs = models[rng.choice(sorted(models))]
            inputs = PlanInput.create(edge_neighbors(n, rng), segs, BLOCK_SIZE)
            lb = lower_bound(inputs)
            for name in FAST:
                ratios[name].append(PLANNERS[name](inputs).makespan_s / lb)
        out[str(n)] = {k: summary(v) for k, v in ratios.items()}
    return out


def bench_gap_bruteforce(quick: bool, rng: random.Random) -> dict[str, Any]:
    """Algorithm 2 (LPT order) vs brute force on the same shards, as in the paper's Fig. 16."""
    trials = 60 if quick else 400
    out: dict[str, Any] = {}
    for kind in ("heterogeneous", "identical"):
        for n in (2, 3, 4):
            ratios, even_ratios, violations = [], [], 0
            for _ in range(trials):
                shards = [rng.randint(1, 64) * MIB for _ in range(rng.randint(n + 1, 8))]
                shards = [shards[k] for k in lpt_order(shards)]
                if kind == "identical":
                    nbs = [Neighbor(f"n{i}", 0.005, 1 / 50e6, 0.0) for i in range(n)]
                else:
                    nbs = edge_neighbors(n, rng)
                greedy = assignment_makespan(shards, greedy_assign(shards, nbs), nbs)
                _, best = brute_force_assign(shards, nbs)
                even = assignment_makespan(shards, [k % n for k in range(len(shards))], nbs)
                ratios.append(greedy / best)
                even_ratios.append(even / best)
                violations += greedy / best > (4 / 3 - 1 / (3 * n)) + 1e-9
            out[f"{kind}-{n}"] = {
                "greedy_vs_bruteforce": summary(ratios),
                "even_vs_bruteforce": summary(even_ratios),
                "graham_bound": 4 / 3 - 1 / (3 * n),
                "bound_violations": violations,
            }
    return out


def _ratio(r: dict[str, float]) -> str:
    return f"{r['mean']:.4f} / {r['max']:.4f}"


def tables(result: dict[str, Any]) -> str:
    """The markdown tables, one per part."""
    lines: list[str] = []
    add = lines.append
    plans = ("chaos", "paper", "waterfill")
    add("\n## Decision time, 64 neighbours, 3 GiB (ms, median / p95; inputs + plan)\n")
    add("| state | tensors | " + " | ".join(plans) + " |")
    add("|---|---:|" + "---:|" * len(plans))
    for r in result["decision"]:
        cells = [f"{r[k]['median_ms']:.3f} / {r[k]['p95_ms']:.3f}" for k in plans]
        add(f"| {r['state']} | {r['tensors']} | " + " | ".join(cells) + " |")
    add("\n## Makespan / waterfill plan's, by state shape (mean / max over neighbour sets)\n")
    add("| shape | MiB | tensors | " + " | ".join(VS_WATERFILL) + " | chaos / LB |")
    add("|---|---:|---:|" + "---:|" * (len(VS_WATERFILL) + 1))
    for r in result["shapes"]:
        cells = [_ratio(r[k]) for k in [*VS_WATERFILL, "chaos_over_lb"]]
        add(f"| {r['state']} | {r['mib']:.0f} | {r['tensors']} | " + " | ".join(cells) + " |")
    st = result["star"]
    add("\n## The issue's star: 200/400/800 Mbit/s, one 500 MiB tensor (modelled s)\n")
    add("| planner | makespan s | / waterfill | / LB | MiB per neighbour |")
    add("|---|---:|---:|---:|---|")
    for k in FAST:
        m = st[k]["makespan_s"]
        mib = ", ".join(f"{n} {v:.1f}" for n, v in st[k]["mib"].items() if v)
        add(f"| {k} | {m:.3f} | {m / st['waterfill']['makespan_s']:.4f} | "
            f"{m / st['lower_bound_s']:.4f} | {mib} |")
    add("\n## Planner run time (ms, median / p95)\n")
    add("| state | MiB | \\|U\\| | " + " | ".join(FAST) + " |")
    add("|---|---:|---:|" + "---:|" * len(FAST))
    for r in result["runtime"]:
        cells = [f"{r[k]['median_ms']:.2f} / {r[k]['p95_ms']:.2f}" for k in FAST]
        add(f"| {r['state']} | {r['mib']:.0f} | {r['neighbors']} | " + " | ".join(cells) + " |")
    add("\n## Makespan / water-filling lower bound (paper models; mean, p95, max)\n")
    add("| \\|U\\| | " + " | ".join(FAST) + " |")
    add("|---:|" + "---|" * len(FAST))
    for n, row in result["gap_lower_bound"].items():
        cells = [f"{row[k]['mean']:.4f}, {row[k]['p95']:.4f}, {row[k]['max']:.4f}" for k in FAST]
        add(f"| {n} | " + " | ".join(cells) + " |")
    add("\n## Algorithm 2 vs brute force on the same shards (ratio; Fig. 16)\n")
    add("| neighbours | greedy mean | greedy max | even mean | Graham bound | > bound |")
    add("|---|---:|---:|---:|---:|---:|")
    for key, row in result["gap_bruteforce"].items():
        g, e = row["greedy_vs_bruteforce"], row["even_vs_bruteforce"]
        add(
            f"| {key} | {g['mean']:.4f} | {g['max']:.4f} | {e['mean']:.4f} | "
            f"{row['graham_bound']:.4f} | {row['bound_violations']}/{g['n']} |"
        )
    return "\n".join(lines)


def draw(plt: Any, result: dict[str, Any]) -> Any:
    # The largest paper model timed (gpt2-large unless --models left it out).
    model = max((r for r in result["runtime"] if not r["state"].startswith("synthetic-")),
                key=lambda r: r["mib"], default=None)
    if model is None:
        return None
    rows = [r for r in result["runtime"] if r["state"] == model["state"]]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in FAST:
        ax.plot(
            [r["neighbors"] for r in rows], [r[name]["median_ms"] for r in rows], "o-", label=name
        )
    ax.axhline(1, color="grey", ls="--", lw=1)  # the default's budget
    ax.set(xscale="log", yscale="log", xlabel="neighbours", ylabel="median ms")
    ax.set_title(f"planner run time, {model['state']} state ({model['mib'] / 1024:.1f} GiB)")
    ax.legend()
    return fig


def run(quick: bool, seed: int, names: list[str] | None, out: Path,
        say: Say) -> dict[str, Any]:
    """Run every part; write ``planner_bench.json`` (and the PNG) under ``out``."""
    rng = random.Random(seed)
    say("decision time, 64 neighbours, 3 GiB")
    result: dict[str, Any] = {"seed": seed, "quick": quick, "models": names,
                              "align_bytes": BLOCK_SIZE, "decision": bench_decision(quick, rng)}
    say("makespan by state shape")
    result["shapes"] = bench_shapes(quick, rng, names)
    result["star"] = bench_star()
    say("planner run time")
    result["runtime"] = bench_runtime(quick, rng, names)
    say("gap to the water-filling bound")
    result["gap_lower_bound"] = bench_gap_lb(quick, rng, names)
    say("gap to brute force")
    result["gap_bruteforce"] = bench_gap_bruteforce(quick, rng)
    output = Output(out, say)
    output.json("planner_bench.json", result)
    output.figure("planner_bench.png", lambda plt: draw(plt, result), dpi=120)
    return result
