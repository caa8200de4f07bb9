"""Convergence under scale-out and scale-in (the paper's section VI-E, Figs. 11-14).

    chaosctl bench convergence --models cnn,chartf --nodes 4 --out bench/results/convergence

Trains real models on data that ships offline, on a real local cluster (a broker, N chaosd,
workers started through chaosd's ``join``, as ``chaosctl join`` does), once per run and
mode, all from the same seed:

- ``static-N`` and ``static-N+1``: the same nodes from the first sample to the last, each
  ``--repeats`` times (3 by default, 1 with ``--short``): repeat ``rK`` seeds the model and the
  data order with ``seed + K - 1``, so the repeats give the band within which a run's loss
  moves for reasons that have nothing to do with scaling;
- ``N->N+1``: a node joins (scale-out) at epoch ``--at``; ``N+1->N``: one leaves (scale-in,
  ``chaosctl leave``) there;
- each in ``plain`` mode (every member takes a fixed local batch, so the global batch follows
  the cluster's size) and ``consistent`` mode (``global_batch=``: N local batches always);
- each in every gradient wire format of ``--wire`` (chaosd's ``[training] wire``: fp32, fp16,
  bf16, int8), compared with the same run in fp32 (``--static-only`` keeps the static runs,
  which is what a comparison of formats needs).

The models are those of :mod:`chaos_edge.examples.cnn` (a CNN with BatchNorm and Dropout on
scikit-learn's digits) and :mod:`chaos_edge.examples.chartf` (a character transformer on
Python's help texts), trained by :mod:`chaos_bench.convergence.worker`. An *epoch* is a
fixed number of global samples. The workers' records (one JSON line per committed step, and
the evaluations at epoch boundaries) are all the report uses
(:mod:`chaos_bench.convergence.report`): the loss and accuracy per epoch, the mean
absolute difference of the loss to the static run with the starting node count and the same
seed, whether each epoch after the change lies inside the static runs' band, and checks
(identical digests at every common step, exact step accounting, a falling loss).
Writes ``convergence.json`` and, with matplotlib, one PNG per model under ``--out``.
"""

from __future__ import annotations

import functools
import math
import platform
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from chaos_bench.convergence import report
from chaos_bench.output import Output, keep_copy
from chaos_bench.progress import Say
from chaos_bench.workers import records
from chaosctl.client import call_once
from chaosctl.cluster import ClusterError, LocalCluster

WORKER_MODULE = "chaos_bench.convergence.worker"
Records = dict[str, list[dict[str, Any]]]
MODES = ("plain", "consistent")
RUN_TIMEOUT_S = 900.0
# At the gate, before a join or a leave: the scheduler places a planned change half a second
# of steps ahead at the step rate it saw over 5 s; once the cluster has held that long, the
# change lands two steps after the gate (STEP_MARGIN) instead of about an epoch later.
# (--short does not wait: the change lands later, and the checks do not mind.)
HOLD_S = 5.5
POLICY_S = 1.0  # then, before the release: the new policy reaches every member meanwhile


@dataclass(frozen=True)
class Plan:
    """How one model trains: epochs of ``epoch_samples`` global samples, the change at ``at``."""

    epochs: int
    epoch_samples: int
    batch: int
    at: int
    tiny: bool = False


PLANS = {"cnn": Plan(12, 1280, 32, 3), "chartf": Plan(6, 4160, 16, 2)}
SHORT = {"cnn": Plan(6, 256, 16, 2, tiny=True), "chartf": Plan(4, 480, 8, 1, tiny=True)}


def plan_of(model: str, nodes: int, short: bool, at: int | None, epochs: int | None) -> Plan:
    """The model's plan, its epoch rounded to a multiple of the global batch of N and of N+1
    nodes in plain mode, so that every run's epochs end on a step."""
    base = (SHORT if short else PLANS)[model]
    unit = math.lcm(nodes * base.batch, (nodes + 1) * base.batch)
    size = max(1, round(base.epoch_samples / unit)) * unit
    return Plan(epochs or base.epochs, size, base.batch, base.at if at is None else at,
                base.tiny)


@dataclass(frozen=True)
class Run:
    """One training run: ``start`` nodes, then ``end`` from epoch ``at`` on. ``repeat`` K > 0
    runs a static configuration again with the seed moved on by K: the spread of those runs
    is the noise a change must be told apart from."""

    model: str
    mode: str
    start: int
    end: int
    repeat: int = 0
    wire: str = "fp32"

    @property
    def name(self) -> str:
        if self.end != self.start:
            return f"{self.start}->{self.end}"
        return f"static-{self.start}" + (f" r{self.repeat + 1}" if self.repeat else "")

    @property
    def key(self) -> str:
        return f"{self.name}/{self.mode}" + ("" if self.wire == "fp32" else f"/{self.wire}")


def runs_of(model: str, nodes: int, modes: list[str], repeats: int = 1,
            wires: tuple[str, ...] = ("fp32",), static_only: bool = False) -> list[Run]:
    """Static N, static N+1, then (unless ``static_only``) scale-out and scale-in; each mode
    in turn, each in every wire format; then the static runs' ``repeats - 1`` repeats."""
    shapes = [(nodes, nodes), (nodes + 1, nodes + 1)]
    if not static_only:
        shapes += [(nodes, nodes + 1), (nodes + 1, nodes)]
    runs = [Run(model, mode, a, b, wire=w) for w in wires for a, b in shapes for mode in modes]
    return runs + [Run(model, mode, a, a, k, w) for k in range(1, repeats) for w in wires
                   for a in (nodes, nodes + 1) for mode in modes]


def worker_argv(run: Run, plan: Plan, nodes: int, work: Path, node: str,
                seed: int) -> list[str]:
    # Consistent mode keeps the global batch of N nodes in every run, so all its runs train
    # with the same global batch as the static-N run.
    gb = plan.batch * nodes if run.mode == "consistent" else 0
    argv = [sys.executable, "-m", WORKER_MODULE, "--model", run.model,
            "--out", str(work / f"{node}.jsonl"), "--epochs", str(plan.epochs),
            "--epoch-samples", str(plan.epoch_samples), "--batch", str(plan.batch),
            "--global-batch", str(gb), "--start-nodes", str(run.start),
            "--gate-epoch", str(plan.at), "--gate", str(work / "gate"),
            "--data", str(work.parent / "digits.npz"), "--seed", str(seed)]
    return argv + (["--tiny"] if plan.tiny else [])


def dirname(run: Run) -> str:
    """A run's directory name under ``--keep`` (after the model's): ``4-5-plain``,
    ``static-4-r2-consistent``."""
    return f"{run.name.replace('->', '-').replace(' ', '-')}-{run.mode}" + (
        "" if run.wire == "fp32" else f"-{run.wire}")


def _records(work: Path) -> Records:
    return {p.stem: records(p) for p in sorted(work.glob("node-*.jsonl"))}


def _failed(c: LocalCluster, recs: Records) -> str | None:
    """A worker that crashed (the daemon restarts it: a second ``start``) or died."""
    for node in c.node_ids:
        log = c.workdir / node / "worker.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        starts = sum(r.get("kind") == "start" for r in recs.get(node, []))
        if "Traceback" in text or starts > 1:
            last = [ln for ln in text.splitlines() if ln.strip()][-1:] or ["(no output)"]
            return f"{node}'s worker failed: {last[0][:200]} (see {log})"
    return None


def run_cluster(run: Run, plan: Plan, nodes: int, work: Path, seed: int, broker: str,
                hold_s: float) -> Records:
    """Run one training run on a fresh local cluster; returns the workers' records."""
    work.mkdir(parents=True)
    size = max(run.start, run.end)
    with LocalCluster(work / "c", size, cluster="conv", broker_kind=broker,
                      config=f'[training]\nwire = "{run.wire}"\n') as c:
        c.start()
        c.wait(lambda: c.agreed(states={"standby": size}), 30, "a scheduler")
        ids = c.node_ids

        def join(node: str, neighbors: list[str]) -> None:
            call_once(c.socket_of(node), "join", {"neighbors": neighbors, "command": worker_argv(
                run, plan, nodes, work, node, seed + run.repeat)}, timeout=10)

        def state(node: str) -> str:
            rows = c.query(ids[0], "nodes") or []
            return next((r["state"] for r in rows if r["id"] == node), "")

        def progress(pred: Callable[[Records], bool], timeout: float, what: str) -> None:
            def check() -> bool:
                recs = _records(work)
                why = _failed(c, recs)
                if why:
                    raise ClusterError(why)
                return pred(recs)
            c.wait(check, timeout, what, every=0.1)

        # The first node bootstraps; the others join it all at once, each from the first
        # (a joiner is never a source).
        join(ids[0], [])
        progress(lambda _: state(ids[0]) == "active", 120, f"{ids[0]} active")
        for node in ids[1 : run.start]:
            join(node, ids[:1])
        progress(lambda _: all(state(n) == "active" for n in ids[: run.start]), 120,
                 f"{run.start} active nodes")
        if run.end != run.start:
            progress(lambda recs: any(r["kind"] == "gate" for rs in recs.values() for r in rs),
                     RUN_TIMEOUT_S, f"epoch {plan.at}")
            time.sleep(hold_s)
            node = ids[min(run.start, run.end)]  # the one that joins, or leaves
            if run.end > run.start:
                join(node, [])  # neighbours by RTT, as a box that arrives
                progress(lambda _: state(node) in ("joining", "active"), 120,
                         f"{node} to ask to join")
            else:
                call_once(c.socket_of(node), "leave", {}, timeout=10)
                progress(lambda _: any(e.get("node") == node for e in c.events(
                    ids[0], "scale-in")), 60, f"{node} to leave")
            time.sleep(POLICY_S)
        (work / "gate").touch()
        finals = ("done", "exit")
        progress(lambda recs: all(any(r["kind"] in finals for r in recs.get(n, []))
                                  for n in ids[:size]), RUN_TIMEOUT_S, "the run to finish")
    return _records(work)


def prepare(models: list[str], tmp: Path, short: bool) -> dict[str, dict[str, Any]]:
    """Load scikit-learn's digits once for every worker (each import costs a second); say
    what data each model trains on (Python's help texts differ between its versions)."""
    data: dict[str, dict[str, Any]] = {}
    if "cnn" in models:
        from chaos_edge.examples import cnn

        x, y = cnn.arrays()
        np.savez(tmp / "digits.npz", x=x, y=y)
        d = cnn.split(x, y)
        data["cnn"] = {"source": "sklearn.datasets.load_digits", "train": len(d.y_train),
                       "val": len(d.y_val)}
    if "chartf" in models:
        from chaos_edge.examples import chartf

        t = chartf.load(*((8_000, 16) if short else (48_000, 32)))  # as the worker's Task
        data["chartf"] = {"source": "pydoc_data.topics", "chars": len(t.train) + len(t.val),
                          "sha256": t.sha256, "vocab": len(t.vocab), "context": t.context,
                          "train_windows": t.n_train}
    return data


def run(models: list[str], nodes: int, modes: list[str], short: bool, at: int | None,
        epochs: int | None, seed: int, out: Path, keep: Path | None,
        say: Say, wires: tuple[str, ...] = ("fp32",), static_only: bool = False,
        repeats: int = 1) -> dict[str, Any]:
    """Every run of every model; writes ``convergence.json`` (and PNGs) under ``out``.

    Raises:
        ClusterError: A run failed (a worker crashed, or the cluster did not form).
    """
    broker = "mosquitto" if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists() \
        else "embedded"
    doc: dict[str, Any] = {"bench": "convergence", "short": short, "nodes": nodes,
                           "modes": modes, "wires": list(wires), "seed": seed,
                           "repeats": repeats, "broker": broker,
                           "python": platform.python_version(), "models": {}}
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        try:
            data = prepare(models, tmp, short)
            for model in models:
                plan = plan_of(model, nodes, short, at, epochs)
                runs: dict[str, Any] = {}
                doc["models"][model] = {"plan": asdict(plan), "data": data[model], "runs": runs}
                for r in runs_of(model, nodes, modes, repeats, wires, static_only):
                    say(f"{model} {r.key}: training on {max(r.start, r.end)} chaosd "
                        f"({broker})...")
                    t0 = time.monotonic()
                    work = tmp / f"{model}-{dirname(r)}"
                    recs = run_cluster(r, plan, nodes, work, seed, broker,
                                       0.0 if short else HOLD_S)
                    res = report.analyse(recs, plan.epoch_samples, plan.epochs)
                    res.update(name=r.name, mode=r.mode, wire=r.wire, start=r.start, end=r.end,
                               repeat=r.repeat, seed=seed + r.repeat,
                               wall_s=round(time.monotonic() - t0, 1),
                               stale_shard_steps=report.stale_shards(recs),
                               problems=report.check(recs, r.start, r.end, plan.epochs
                                                     * plan.epoch_samples))
                    runs[r.key] = res
                    say(f"{model} {r.key}: {report.summary(res)}")
                report.compare(doc["models"][model], plan.at)
                report.bands(doc["models"][model], plan.at)
        finally:  # the records matter most when a run failed
            if keep is not None:
                keep_copy(tmp, keep, say, "the records and logs", "*.npz")
    output = Output(out, say)
    output.json("convergence.json", doc)
    for model, m in doc["models"].items():
        output.figure(f"convergence-{model}.png",
                      functools.partial(report.draw, model=model, mdoc=m), dpi=120)
    return doc
