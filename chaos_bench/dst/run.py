"""One simulated run per seed; replaying one; shrinking a failing one; many on every core.

A run's result carries the digest of its trace: the same seed (and plan) run twice must give
the same digest, or the harness has let real time or an unseeded random in, and says so.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from chaos_bench.dst.cluster import Cluster, quiet_logs
from chaos_bench.dst.faults import EVERY_DRAW, Draws, Plan, make_plan
from chaos_bench.dst.loop import HarnessError, Sim
from chaos_bench.dst.mutants import applied
from chaos_bench.dst.referee import Violation

CHECK_EVERY_S = 0.5  # the whole-cluster checks (stall, join bounds) run at this pace


@dataclass
class Result:
    """What one run found."""

    seed: int
    digest: str
    events: int
    sim_s: float
    cpu_s: float
    frontier: int
    violations: list[Violation]
    coverage: dict[str, int]
    pace: float  # the plan's: seconds between a simulated worker's steps
    trace: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.violations

    def as_json(self) -> dict[str, Any]:
        return {"seed": self.seed, "digest": self.digest, "events": self.events,
                "sim_s": self.sim_s, "cpu_s": round(self.cpu_s, 4), "frontier": self.frontier,
                "pace": self.pace, "violations": [v.__dict__ for v in self.violations]}


def run_plan(plan: Plan, trace: bool = False, mutant: str | None = None) -> Result:
    """Run ``plan`` to its end (with ``mutant``'s fault put back, if named); every invariant
    is checked after every event."""
    with applied(mutant):
        return _run(plan, trace)


def _run(plan: Plan, trace: bool) -> Result:
    with quiet_logs():
        return _run_quietly(plan, trace)


def _run_quietly(plan: Plan, trace: bool) -> Result:
    t0 = time.process_time()
    sim = Sim(plan.seed, trace=trace)
    cluster = Cluster(plan, sim)
    try:
        cluster.start()
        ref = cluster.ref

        def every() -> None:
            cluster.check()
            sim.at(CHECK_EVERY_S, every)

        sim.at(CHECK_EVERY_S, every)
        sim.run_until(plan.duration)
    finally:
        cluster.close()
    summary = ref.summary()
    return Result(plan.seed, sim.digest, sim.events, plan.duration, time.process_time() - t0,
                  summary["frontier"], list(ref.violations), summary["coverage"],
                  plan.pace, sim.lines or [])


def run_seed(seed: int, duration: float = 90.0, trace: bool = False,
             mutant: str | None = None, draws: Draws = EVERY_DRAW) -> Result:
    return run_plan(make_plan(seed, duration, draws=draws), trace, mutant)


def replay(seed: int, duration: float = 90.0, mutant: str | None = None,
           draws: Draws = EVERY_DRAW) -> Result:
    """Run ``seed`` twice with its trace; the two must be the same run.

    Raises:
        HarnessError: They differ (real time or an unseeded random leaked in).
    """
    a = run_seed(seed, duration, trace=True, mutant=mutant, draws=draws)
    b = run_seed(seed, duration, trace=True, mutant=mutant, draws=draws)
    if a.digest != b.digest or a.events != b.events:
        first = next((i for i, (x, y) in enumerate(zip(a.trace, b.trace, strict=False))
                      if x != y), min(len(a.trace), len(b.trace)))
        raise HarnessError(f"seed {seed} does not replay: traces part at line {first}: "
                           f"{a.trace[first:first + 1]} vs {b.trace[first:first + 1]}")
    return a


def shrink(plan: Plan, kinds: set[str], budget: int = 200, mutant: str | None = None) -> Plan:
    """The smallest plan (fault by fault, greedily) that still breaks one of ``kinds``."""
    def fails(p: Plan) -> bool:
        return any(v.kind in kinds for v in run_plan(p, mutant=mutant).violations)

    runs = 0
    changed = True
    while changed and runs < budget:
        changed = False
        i = 0
        while i < len(plan.faults) and runs < budget:
            candidate = plan.without(i)
            runs += 1
            if fails(candidate):
                plan, changed = candidate, True
            else:
                i += 1
    return plan


def _one(args: tuple[int, float, str | None, Draws]) -> dict[str, Any]:
    seed, duration, mutant, draws = args
    try:
        res = run_seed(seed, duration, mutant=mutant, draws=draws)
    except HarnessError as exc:
        return {"seed": seed, "harness_error": str(exc)}
    except Exception as exc:  # a crash of the code under test is a finding, not the end
        return {"seed": seed, "crash": f"{type(exc).__name__}: {exc}"}
    doc = res.as_json()
    doc["coverage"] = res.coverage
    return doc


def run_many(seeds: Iterable[int], duration: float, jobs: int,
             progress: Callable[[dict[str, Any]], None] | None = None,
             mutant: str | None = None, draws: Draws = EVERY_DRAW) -> list[dict[str, Any]]:
    """Run ``seeds`` on ``jobs`` processes (each with the same hash seed, so that a seed
    replays in any process); ``progress`` is called with each result as it comes.
    ``draws``: which later fault streams each seed's plan draws (:class:`Draws`)."""
    os.environ.setdefault("PYTHONHASHSEED", "0")
    out: list[dict[str, Any]] = []
    todo = [(s, duration, mutant, draws) for s in seeds]
    if jobs <= 1:
        for item in todo:
            doc = _one(item)
            out.append(doc)
            if progress is not None:
                progress(doc)
        return out
    # The workers ignore Ctrl-C: the parent keeps what they finished, then ends them
    # (terminate: a worker left to finish its chunk outlived an interrupted run by minutes).
    pool = multiprocessing.get_context("fork").Pool(jobs, initializer=_pool_worker)
    try:
        for doc in pool.imap(_one, todo, chunksize=8):
            out.append(doc)
            if progress is not None:
                progress(doc)
    except BaseException:
        pool.terminate()
        raise
    finally:
        pool.close()
        pool.join()
    return out


def _pool_worker() -> None:
    """A campaign's worker: Ctrl-C is the parent's to handle; SIGTERM (terminate) ends it
    through the seed's ``finally``, which removes the seed's temp dir."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, _exit_on_term)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)
