"""The sweep: scale-out delay and idle time against the cluster's size (Figs. 7 and 10).

For every size N and repeat, a fresh testbed-like instance
(:func:`~chaos_bench.sim.topology.generate`:
random topology, the new node with 3 neighbours, tbf rates drawn from 100-1000 Mbit/s), every
model and every strategy; medians over the repeats, as the paper reports 4 repeats.
"""

from __future__ import annotations

import random
import statistics
from collections.abc import Sequence
from typing import Any

from chaos_bench.models import tensor_sizes
from chaos_bench.progress import Say
from chaos_bench.sim.scaleout import STRATEGIES, Costs, simulate
from chaos_bench.sim.topology import generate


def instance_seed(seed: int, size: int, rep: int) -> int:
    """The seed of one instance: the same for the same (seed, size, repeat) on any machine."""
    return seed * 1_000_003 + size * 101 + rep


def run(sizes: Sequence[int], models: Sequence[str], repeats: int, seed: int, costs: Costs,
        say: Say) -> list[dict[str, Any]]:
    """One row per (size, model): median delay and idle per strategy over ``repeats``."""
    rows = []
    for size in sizes:
        insts = [generate(size, random.Random(instance_seed(seed, size, r)))
                 for r in range(repeats)]
        for model in models:
            segments = tensor_sizes(model)
            delay: dict[str, list[float]] = {s: [] for s in STRATEGIES}
            idle: dict[str, list[float]] = {s: [] for s in STRATEGIES}
            for inst in insts:
                for strat in STRATEGIES:
                    out = simulate(inst, strat, segments, costs)
                    delay[strat].append(out.delay_s)
                    idle[strat].append(out.idle_s)
            med = {s: statistics.median(v) for s, v in delay.items()}
            rows.append({"size": size, "model": model, "repeats": repeats, "delay_s": med,
                         "idle_s": {s: statistics.median(v) for s, v in idle.items()}})
            say(f"scale-out {size} -> {size + 1}, {model}: " + ", ".join(
                f"{s} {med[s]:.2f} s" for s in STRATEGIES))
    return rows
