"""``chaosctl bench simulate``: validation, then the sweep, the broker and the failovers.

Everything but the optional broker measurement is a function of the seed and the inputs
(the testbed's JSON, the broker model), so a seed gives the same document on any machine.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from chaos_bench.progress import Say
from chaos_bench.sim import broker, churn, failover, sweep, validate
from chaos_bench.sim.broker import BrokerModel
from chaos_bench.sim.scaleout import Costs

MODELS = ("resnet101", "alexnet", "vgg11")
FAULTS = ("kill9", "sigstop")
#: Membership changes per node-hour (joins + leaves + failures of the churn runs), for the
#: saturation with churn.
CHURN_PER_NODE_H = sum(dataclasses.astuple(churn.ChurnRates()))
#: Churn runs up to here: each membership change runs the real policy step and packs the
#: snapshot in CPU (about 0.06 s at 1,000 members): 600 simulated s there take about 30 CPU-s,
#: and the cost grows about as N^2 (changes per second and snapshot bytes both grow with N).
CHURN_MAX_NODES = 1_000
POLICY_MAX_NODES = 10_000  # its CPU time is measured up to here (O(N) since issue 12)


@dataclasses.dataclass(frozen=True)
class Options:
    """What one run simulates."""

    nodes: tuple[int, ...] = (12, 100, 1000, 10000)
    seed: int = 1
    repeats: int = 4
    models: tuple[str, ...] = MODELS
    testbed: Path | None = validate.DEFAULT_TESTBED
    holdout: Path | None = None  # fresh testbed results, predicted from the ``testbed`` fit
    broker_model: BrokerModel | None = None
    broker_measured: bool = False
    churn_seconds: float = 600.0


def broker_rows(nodes: Sequence[int], model: BrokerModel) -> list[dict[str, Any]]:
    """Heartbeat deliveries/s and the broker core's utilisation per pattern, and the snapshot."""
    rows = []
    for n in nodes:
        row: dict[str, Any] = {"nodes": n, "snapshot_bytes": broker.snapshot_bytes(n)}
        for p in broker.PATTERNS:
            _, dels = broker.heartbeat_load(n, p)
            row[p] = {"deliveries_per_s": dels,
                      "utilisation": broker.utilisation(n, p, model),
                      "utilisation_churn": broker.utilisation(
                          n, p, model, CHURN_PER_NODE_H * n / 3600.0)}
        rows.append(row)
    return rows


def failover_rows(nodes: Sequence[int], model: BrokerModel, seed: int) -> list[dict[str, Any]]:
    """Both faults under both patterns, plus the new scheduler's first snapshot to everyone."""
    rows = []
    for n in nodes:
        for fault in FAULTS:
            for p in broker.PATTERNS:
                row = failover.run(n, fault, p, model, seed)
                snap = broker.snapshot_bytes(n)
                row["snapshot_over_limit"] = snap > broker.MAX_PAYLOAD
                row["snapshot_fanout_s"] = None if row["saturated"] else (
                    model.cost(1, n, n * snap) / (1.0 - row["rho"]))
                rows.append(row)
    return rows


def run(opts: Options, say: Say) -> dict[str, Any]:
    """The whole simulation; returns the JSON document (the caller writes it)."""
    t0 = time.perf_counter()
    doc: dict[str, Any] = {"meta": {"nodes": list(opts.nodes), "seed": opts.seed,
                                    "repeats": opts.repeats, "models": list(opts.models)}}
    costs = Costs()
    if opts.testbed is not None:
        tb = validate.load(opts.testbed)
        costs = validate.calibrate(tb)
        say(f"validation: replaying {len(tb['instances'])} testbed instances of {opts.testbed}")
        doc["validation"] = validate.replay(tb, costs)
        doc["meta"]["testbed"] = str(opts.testbed)
        if opts.holdout is not None:
            fresh = validate.load(opts.holdout)
            say(f"out of sample: predicting {len(fresh['instances'])} instances of "
                f"{opts.holdout} from their configured rates")
            doc["holdout"] = validate.holdout(tb, fresh)
            doc["meta"]["holdout"] = str(opts.holdout)
    doc["meta"]["costs"] = dataclasses.asdict(costs)
    doc["sweep"] = sweep.run(opts.nodes, opts.models, opts.repeats, opts.seed, costs, say)
    model = opts.broker_model or _default_model()
    doc["meta"]["broker_model"] = dataclasses.asdict(model)
    doc["meta"]["broker_measured"] = opts.broker_measured
    say("broker load and failover")
    doc["broker"] = broker_rows(opts.nodes, model)
    doc["saturation"] = {
        "service_rate_hb_per_s": model.service_rate(),
        "snapshot_limit_nodes": broker.snapshot_limit_n(),
        "max_payload_bytes": broker.MAX_PAYLOAD,
        "churn_per_node_h": CHURN_PER_NODE_H,
        **{p: {"nodes": broker.saturation_n(p, model),
               "nodes_with_churn": broker.saturation_n(p, model, CHURN_PER_NODE_H)}
           for p in broker.PATTERNS},
    }
    doc["failover"] = failover_rows(opts.nodes, model, opts.seed)
    doc["churn"] = []
    churn_cpu: dict[str, float] = {}
    for n in sorted({min(x, CHURN_MAX_NODES) for x in opts.nodes}):
        say(f"churn: {opts.churn_seconds:g} s of Poisson joins, leaves and failures on {n} nodes")
        t_cpu = time.process_time()
        doc["churn"].append(churn.run(n, opts.seed, opts.churn_seconds, churn.ChurnRates(),
                                      model, costs))
        churn_cpu[str(n)] = time.process_time() - t_cpu
    # Measured CPU, not simulated: kept apart so that the rest stays a function of the seed.
    doc["measured"] = {"policy_cpu_s": {str(n): broker.policy_cpu_s(n) for n in
                                        sorted({min(x, POLICY_MAX_NODES) for x in opts.nodes})},
                       "churn_run_cpu_s": churn_cpu}
    doc["meta"]["wall_s_not_seeded"] = time.perf_counter() - t0
    return doc


def _default_model() -> BrokerModel:
    from chaos_bench.sim.rate import DEFAULT_MODEL

    return DEFAULT_MODEL

