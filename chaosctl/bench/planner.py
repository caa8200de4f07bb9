"""Planner benchmark: run time per planner, and the optimality gap of Algorithms 1 and 2.

Usage: ``python bench/planner_bench.py --out DIR [--quick] [--seed N]``

1. Run time of every fast planner for 2..64 neighbours on states from 1 MiB to 3 GiB: the
   paper's models (tensor shapes from ``shared/models/paper_models.json``) and synthetic tensor
   lists. Median and p95 over repeats of ``time.perf_counter``.
2. Gap of Algorithms 1+2 (``chaos``) and of ``even`` against the water-filling lower bound, over
   random neighbour sets on the paper's models.
3. Gap of Algorithm 2 against brute force on the same shards (the paper's Fig. 16), for
   heterogeneous and for identical neighbours, with Graham's ``4/3 - 1/(3|U|)`` next to it.

Writes ``planner_bench.json`` (and ``planner_bench.png`` if matplotlib is importable) to DIR and
prints markdown tables.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from daemon.replication.planning.exact import assignment_makespan, brute_force_assign  # noqa: E402
from daemon.replication.planning.greedy import greedy_assign, lpt_order  # noqa: E402
from daemon.replication.planning.model import Neighbor, PlanInput  # noqa: E402
from daemon.replication.planning.planner import PLANNERS  # noqa: E402
from daemon.replication.planning.waterfill import lower_bound  # noqa: E402

MODELS = ROOT.parent / "shared" / "models" / "paper_models.json"
FAST = ["chaos", "greedy", "waterfill", "even", "single"]
MIB = 1 << 20
ITEMSIZE = {"float32": 4, "float16": 2, "int64": 8}


def paper_states() -> dict[str, list[int]]:
    """Tensor byte sizes (parameters, then buffers) of each of the paper's models."""
    data = json.loads(MODELS.read_text())
    out = {}
    for name, m in data["models"].items():
        tensors = m["tensors"] + m.get("buffers", [])
        out[name] = [math.prod(t["shape"]) * ITEMSIZE[t["dtype"]] for t in tensors]
    return out


def synthetic_state(total: int, rng: random.Random, n: int = 200) -> list[int]:
    """A tensor list of ``total`` bytes with log-uniform sizes (biases up to big matrices)."""
    weights = [math.exp(rng.uniform(0, 10)) for _ in range(n)]
    scale = total / sum(weights)
    sizes = [max(4, int(w * scale) // 4 * 4) for w in weights]
    sizes[-1] += total - sum(sizes)
    return [s for s in sizes if s > 0]


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


def bench_runtime(quick: bool, rng: random.Random) -> list[dict[str, Any]]:
    states = {f"synthetic-{s}MiB": synthetic_state(s * MIB, rng) for s in (1, 64, 1024, 3072)}
    models = paper_states()
    states.update(models if not quick else {"gpt2-large": models["gpt2-large"]})
    counts = [2, 8, 64] if quick else [2, 4, 8, 16, 32, 64]
    repeats = 5 if quick else 21
    rows = []
    for state, segs in states.items():
        for n in counts:
            inputs = PlanInput.create(edge_neighbors(n, rng), segs)
            row: dict[str, Any] = {"state": state, "mib": sum(segs) / MIB, "neighbors": n}
            for name in FAST:
                med, p95 = timeit(lambda f=PLANNERS[name], i=inputs: f(i), repeats)
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


def bench_gap_lb(quick: bool, rng: random.Random) -> dict[str, Any]:
    """Makespan / water-filling bound of chaos, greedy, even and single on the paper's models."""
    models = paper_states()
    trials = 5 if quick else 40
    out: dict[str, Any] = {}
    for n in [2, 4, 8, 16, 64]:
        ratios: dict[str, list[float]] = {k: [] for k in FAST}
        for _ in range(trials):
            segs = models[rng.choice(sorted(models))]
            inputs = PlanInput.create(edge_neighbors(n, rng), segs)
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


def print_tables(result: dict[str, Any]) -> None:
    print("\n## Planner run time (ms, median / p95)\n")
    print("| state | MiB | \\|U\\| | " + " | ".join(FAST) + " |")
    print("|---|---:|---:|" + "---:|" * len(FAST))
    for r in result["runtime"]:
        cells = [f"{r[k]['median_ms']:.2f} / {r[k]['p95_ms']:.2f}" for k in FAST]
        print(f"| {r['state']} | {r['mib']:.0f} | {r['neighbors']} | " + " | ".join(cells) + " |")
    print("\n## Makespan / water-filling lower bound (paper models; mean, p95, max)\n")
    print("| \\|U\\| | " + " | ".join(FAST) + " |")
    print("|---:|" + "---|" * len(FAST))
    for n, row in result["gap_lower_bound"].items():
        cells = [f"{row[k]['mean']:.4f}, {row[k]['p95']:.4f}, {row[k]['max']:.4f}" for k in FAST]
        print(f"| {n} | " + " | ".join(cells) + " |")
    print("\n## Algorithm 2 vs brute force on the same shards (ratio; Fig. 16)\n")
    print("| neighbours | greedy mean | greedy max | even mean | Graham bound | > bound |")
    print("|---|---:|---:|---:|---:|---:|")
    for key, row in result["gap_bruteforce"].items():
        g, e = row["greedy_vs_bruteforce"], row["even_vs_bruteforce"]
        print(
            f"| {key} | {g['mean']:.4f} | {g['max']:.4f} | {e['mean']:.4f} | "
            f"{row['graham_bound']:.4f} | {row['bound_violations']}/{g['n']} |"
        )


def plot(result: dict[str, Any], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in result["runtime"] if r["state"] == "gpt2-large"]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name in FAST:
        ax.plot(
            [r["neighbors"] for r in rows], [r[name]["median_ms"] for r in rows], "o-", label=name
        )
    ax.axhline(10, color="grey", ls="--", lw=1)
    ax.set(xscale="log", yscale="log", xlabel="neighbours", ylabel="median ms")
    ax.set_title("planner run time, GPT-2 large state (2.9 GiB)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory for JSON and PNG")
    parser.add_argument("--quick", action="store_true", help="fewer sizes, repeats and trials")
    parser.add_argument("--seed", type=int, default=2024)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    result = {
        "seed": args.seed,
        "quick": args.quick,
        "runtime": bench_runtime(args.quick, rng),
        "gap_lower_bound": bench_gap_lb(args.quick, rng),
        "gap_bruteforce": bench_gap_bruteforce(args.quick, rng),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "planner_bench.json").write_text(json.dumps(result, indent=1))
    print_tables(result)
    if plot(result, args.out / "planner_bench.png"):
        print(f"\nwrote {args.out / 'planner_bench.png'}")
    print(f"wrote {args.out / 'planner_bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
