"""What durable snapshots cost: on the step's path, on the writer's thread, on the disk.

``chaosctl bench snapshots [--quick] [--models cnn,mlp100m] [--out DIR]``

One process, no cluster, one torch thread (as a worker on an edge box runs), the Trainer's
own :class:`~chaos_edge.trainer.replica.Replica` around each model and its optimizer. Per model
(``cnn``: the CNN of :mod:`chaos_edge.examples.cnn` on random 8x8 images, AdamW; ``mlp100m``:
a plain MLP of about 100M parameters, Adam):

1. the local training step (forward, backward, ``optimizer.step()``, ``zero_grad``), median
   over several steps;
2. one snapshot: the capture the step's path pays (``Replica.snapshot(hashed=False)``, the
   median of several), and what the writer's thread pays (``StateSpace.hashed()``, then
   ``SnapshotStore.write``: write, fsync, rename, read back and verify), wall and CPU time,
   and the file's size;
3. end to end: runs of N steps with a :class:`~chaos_edge.trainer.snapshots.Snapshotter`
   (``committed()`` after each step, as the Trainer calls it, on a schedule dense enough to
   take several snapshots) against runs of N steps without, interleaved in pairs, the order
   alternating. The writer's thread competes with training for the CPU, so this is the cost
   as a box pays it;
4. derived, at the default settings (``every_steps=100``, ``every_s=10``): the interval
   between snapshots, snapshots and disk bytes per hour, and the shares of the step's path
   and of one core the writer takes. No bytes cross the network: each member writes its
   own copy to its own disk.

The snapshots are written to a temporary folder inside DIR (so to DIR's disk), deleted at
the end. Writes ``snapshots.json`` (every timed value, not only the summaries) and
``snapshots.md`` to DIR.
"""

from __future__ import annotations

import gc
import math
import os
import platform
import resource
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from chaos_bench.output import Output
from chaos_bench.progress import Say
from chaos_edge.replication.state import StateSpace
from chaos_edge.trainer.objects import Registry
from chaos_edge.trainer.replica import Replica
from chaos_edge.trainer.snapshots import (
    SnapshotSettings,
    SnapshotStore,
    Snapshotter,
    space_digest,
)
from chaos_edge.trainer.stepper import Stepper
from daemon.contracts.clock import SystemClock

CLUSTER = "bench"
DEFAULTS = SnapshotSettings()  # every_steps=100, every_s=10, keep=3: what chaosd ships


@dataclass(frozen=True)
class Plan:
    """How one model is measured.

    Attributes:
        model: ``cnn`` or ``mlp100m``.
        batch: Samples per step (random data, made once).
        steps: Timed training steps (part 1).
        captures: Timed captures (part 2).
        writes: Timed hash + write of a snapshot (part 2).
        run_steps: Steps of each end-to-end run (part 3).
        every_steps: The end-to-end runs' schedule (``every_s`` 0).
        pairs: End-to-end pairs (with, without).
        warmup: Untimed steps first (the optimizer's state is made at its first step).
        width: The MLP's width (``mlp100m``; tests pass a narrow one).
        layers: The MLP's hidden layers (``mlp100m``).
    """

    model: str
    batch: int
    steps: int
    captures: int
    writes: int
    run_steps: int
    every_steps: int
    pairs: int
    warmup: int = 3
    width: int = 4096
    layers: int = 6


# cnn: a step is milliseconds, a snapshot about 0.3 MB; every 10 steps is a dense schedule.
# mlp100m: about 1.2 GB a snapshot (weights and Adam's two moments); 1.6 GB to train.
PLANS: dict[str, Plan] = {
    "cnn": Plan("cnn", 128, steps=200, captures=30, writes=10, run_steps=200, every_steps=10,
                pairs=5),
    "mlp100m": Plan("mlp100m", 32, steps=10, captures=5, writes=3, run_steps=30, every_steps=5,
                    pairs=3, warmup=2),
}
QUICK_PLANS: dict[str, Plan] = {
    "cnn": Plan("cnn", 128, steps=30, captures=5, writes=3, run_steps=40, every_steps=10,
                pairs=3, warmup=2),
    "mlp100m": Plan("mlp100m", 32, steps=3, captures=2, writes=1, run_steps=10, every_steps=5,
                    pairs=3, warmup=1),
}
MODELS = list(PLANS)
# mlp100m at its peak: weights, grads and two moments (1.6 GB), the capture, and the writer's
# read-back with the copies it verifies (3 x 1.2 GB), while the next step trains.
MLP_RAM = 6_000_000_000
QUICK_MODELS = ["cnn"]


def mlp(width: int, layers: int, classes: int = 10) -> nn.Module:
    """``layers`` Linear(width, width)+ReLU, then Linear(width, classes): at width 4096 and 6
    layers, 100.7M parameters."""
    parts: list[nn.Module] = []
    for _ in range(layers):
        parts += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*parts, nn.Linear(width, classes))


def build(plan: Plan) -> tuple[nn.Module, torch.optim.Optimizer, Callable[[], None]]:
    """The model, its optimizer, and one local training step on a fixed random batch."""
    torch.manual_seed(0)
    model: nn.Module
    if plan.model == "cnn":
        from chaos_edge.examples.cnn import DigitsCNN  # scikit-learn is only for its data

        model = DigitsCNN()
        opt: torch.optim.Optimizer = torch.optim.AdamW(model.parameters(), lr=0.01,
                                                       weight_decay=1e-4)
        x = torch.randn(plan.batch, 1, 8, 8)
    elif plan.model == "mlp100m":
        model = mlp(plan.width, plan.layers)
        opt = torch.optim.Adam(model.parameters(), lr=1e-4)
        x = torch.randn(plan.batch, plan.width)
    else:
        raise ValueError(f"unknown model {plan.model!r}; choose from {', '.join(MODELS)}")
    y = torch.randint(0, 10, (plan.batch,))
    model.train()

    def step() -> None:
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    return model, opt, step


class CountingReplica(Replica):
    """The Trainer's replica, counting the captures (a Snapshotter takes one per snapshot)."""

    captures = 0

    def snapshot(self, hashed: bool = True) -> StateSpace:
        self.captures += 1
        return super().snapshot(hashed)


def _s(x: float) -> float:
    return round(x, 7)


def _spread(values: list[float]) -> dict[str, float]:
    return {"min": _s(min(values)), "median": _s(statistics.median(values)),
            "max": _s(max(values))}


def _peak_rss() -> int:
    """The process's peak resident memory so far, bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def time_steps(step: Callable[[], None], n: int) -> list[float]:
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        step()
        times.append(_s(time.perf_counter() - t0))
    return times


def time_captures(rep: Replica, n: int) -> list[float]:
    """What the step's path pays per snapshot: the copy, not the hashing."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        space = rep.snapshot(hashed=False)
        times.append(_s(time.perf_counter() - t0))
        del space
    return times


def time_writes(rep: Replica, n: int, folder: Path) -> dict[str, list[Any]]:
    """What the writer's thread pays per snapshot (timed here, on this thread, alone):
    the block digests, then the atomic write, read back and verified; wall and CPU time."""
    store = SnapshotStore(folder, CLUSTER, DEFAULTS.keep)
    out: dict[str, list[Any]] = {"hash_s": [], "write_s": [], "total_s": [], "cpu_s": [],
                                 "bytes": []}
    for i in range(n):
        rep.step = (i + 1) * DEFAULTS.every_steps
        space = rep.snapshot(hashed=False)
        c0, t0 = time.thread_time(), time.perf_counter()
        space = space.hashed()
        t1 = time.perf_counter()
        snap = store.write(space, space_digest(space))
        t2, c1 = time.perf_counter(), time.thread_time()
        out["hash_s"].append(_s(t1 - t0))
        out["write_s"].append(_s(t2 - t1))
        out["total_s"].append(_s(t2 - t0))
        out["cpu_s"].append(_s(c1 - c0))
        out["bytes"].append(snap.path.stat().st_size)
        del space
    shutil.rmtree(folder, ignore_errors=True)
    return out


def one_run(rep: CountingReplica, step: Callable[[], None], plan: Plan,
            folder: Path | None) -> dict[str, Any]:
    """``plan.run_steps`` steps, with a Snapshotter writing to ``folder`` (None: without).

    The clock stops after the last step; the snapshot still in flight then is finished
    (untimed) before the next run, so runs do not overlap."""
    rep.step, rep.captures = 0, 0
    failures: list[str] = []
    snapper = None if folder is None else Snapshotter(
        SnapshotSettings(str(folder), plan.every_steps, 0.0, DEFAULTS.keep), CLUSTER, rep,
        SystemClock(), failures.append)
    times, captures, committed = [], [], 0.0
    start = time.perf_counter()
    for _ in range(plan.run_steps):
        t0 = time.perf_counter()
        step()
        rep.step += 1  # the round committed
        if snapper is not None:
            before, t1 = rep.captures, time.perf_counter()
            snapper.committed()
            t2 = time.perf_counter()
            committed += t2 - t1
            if rep.captures > before:
                captures.append(_s(t2 - t1))
        times.append(_s(time.perf_counter() - t0))
    total = time.perf_counter() - start
    if snapper is not None:
        snapper.close()
        shutil.rmtree(folder or "", ignore_errors=True)
    return {"with_snapshots": folder is not None, "total_s": _s(total),
            "mean_step_s": _s(total / plan.run_steps), "steps_s": times,
            "committed_s": _s(committed), "captures": rep.captures, "capture_s": captures,
            "failed": (snapper.writer.failed if snapper is not None else None)
            or (failures[0] if failures else None)}


def end_to_end(rep: CountingReplica, step: Callable[[], None], plan: Plan, work: Path,
               say: Say) -> dict[str, Any]:
    """Interleaved pairs of runs with and without snapshots, the order alternating."""
    pairs: list[dict[str, Any]] = []
    for i in range(plan.pairs):
        say(f"{plan.model}: end-to-end pair {i + 1}/{plan.pairs} ({plan.run_steps} steps each, "
            f"a snapshot due every {plan.every_steps})")
        order = (True, False) if i % 2 == 0 else (False, True)
        runs = {}
        for with_snapshots in order:
            folder = Path(tempfile.mkdtemp(dir=work)) if with_snapshots else None
            runs[with_snapshots] = one_run(rep, step, plan, folder)
        w, wo = runs[True], runs[False]
        cost = ((w["total_s"] - wo["total_s"]) / w["captures"]) if w["captures"] else None
        pairs.append({"first": "with" if order[0] else "without", "with": w, "without": wo,
                      "ratio": _s(w["mean_step_s"] / wo["mean_step_s"]),
                      "cost_per_snapshot_s": None if cost is None else _s(cost)})
    costs = [p["cost_per_snapshot_s"] for p in pairs if p["cost_per_snapshot_s"] is not None]
    return {"run_steps": plan.run_steps, "every_steps": plan.every_steps, "every_s": 0.0,
            "pairs": pairs,
            "mean_step_s_with": _spread([p["with"]["mean_step_s"] for p in pairs]),
            "mean_step_s_without": _spread([p["without"]["mean_step_s"] for p in pairs]),
            "ratio": _spread([p["ratio"] for p in pairs]),
            "snapshots_per_run": [p["with"]["captures"] for p in pairs],
            "cost_per_snapshot_s": _spread(costs) if costs else None,
            "failed": next((p["with"]["failed"] for p in pairs if p["with"]["failed"]), None)}


def at_defaults(step_s: float, capture_s: float, background_s: float, background_cpu_s: float,
                nbytes: int, in_run_s: float | None,
                settings: SnapshotSettings = DEFAULTS) -> dict[str, Any]:
    """What the default schedule costs a member at this step time.

    A snapshot comes due at a multiple of ``every_steps`` once ``every_s`` have passed since
    the last one and the writer is free again: the interval is the first multiple of
    ``every_steps`` steps that lasts ``max(every_s, background_s)``."""
    block = settings.every_steps * step_s
    steps = settings.every_steps * max(1, math.ceil(max(settings.every_s, background_s) / block))
    interval = steps * step_s
    per_hour = 3600.0 / interval
    return {"every_steps": settings.every_steps, "every_s": settings.every_s,
            "keep": settings.keep, "interval_steps": steps, "interval_s": _s(interval),
            "snapshots_per_hour": round(per_hour, 3),
            "disk_bytes_per_hour": round(per_hour * nbytes),
            "disk_bytes_held": (settings.keep + 1) * nbytes,  # keep, and one being written
            "step_path_share": _s(capture_s / interval),
            "writer_cpu_share": _s(background_cpu_s / interval),
            "in_run_share": None if in_run_s is None else _s(in_run_s / interval),
            "network_bytes_per_hour": 0}


def measure(plan: Plan, work: Path, say: Say) -> dict[str, Any]:
    """Parts 1 to 4 for one model."""
    model, opt, step = build(plan)
    params = sum(p.numel() for p in model.parameters())
    rep = CountingReplica(model, opt, Registry(None, None), Stepper(model, opt))
    time_steps(step, plan.warmup)  # the optimizer's state exists after its first step
    say(f"{plan.model}: {params:,} parameters, {rep.local_bytes() / 1e6:.1f} MB of state; "
        f"{plan.steps} timed training steps")
    steps = time_steps(step, plan.steps)
    say(f"{plan.model}: {plan.captures} captures, {plan.writes} snapshot writes")
    captures = time_captures(rep, plan.captures)
    writes = time_writes(rep, plan.writes, Path(tempfile.mkdtemp(dir=work)))
    e2e = end_to_end(rep, step, plan, work, say)
    step_s, capture_s = statistics.median(steps), statistics.median(captures)
    background_s = statistics.median(writes["total_s"])
    background_cpu_s = statistics.median(writes["cpu_s"])
    nbytes = max(writes["bytes"])
    in_run = e2e["cost_per_snapshot_s"]
    row = {"model": plan.model, "plan": asdict(plan), "params": params,
           "state_bytes": rep.local_bytes(), "snapshot_bytes": nbytes,
           "step": {"times_s": steps, "median_s": _s(step_s)},
           "capture": {"times_s": captures, "median_s": _s(capture_s)},
           "background": {**writes, "median_hash_s": _s(statistics.median(writes["hash_s"])),
                          "median_write_s": _s(statistics.median(writes["write_s"])),
                          "median_s": _s(background_s), "median_cpu_s": _s(background_cpu_s)},
           "end_to_end": e2e,
           "defaults": at_defaults(step_s, capture_s, background_s, background_cpu_s, nbytes,
                                   None if in_run is None else in_run["median"]),
           "peak_rss_bytes": _peak_rss()}
    del model, opt, step, rep
    gc.collect()
    return row


def _available() -> int | None:
    """MemAvailable, bytes (Linux), or None."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def run(quick: bool, models: list[str] | None, out: Path, say: Say,
        plans: dict[str, Plan] | None = None) -> dict[str, Any]:
    """Measure ``models`` (default: cnn with ``quick``, else both); ``plans`` overrides the
    built-in ones (tests: a narrow MLP)."""
    names = models or (QUICK_MODELS if quick else MODELS)
    table_of = {**(QUICK_PLANS if quick else PLANS), **(plans or {})}
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        raise ValueError(f"unknown model {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    free = _available()
    if "mlp100m" in names and free is not None and free < MLP_RAM:
        say(f"warning: mlp100m peaks near {MLP_RAM / 1e9:.0f} GB (training, the capture, and the "
            f"write's read-back), {free / 1e9:.1f} GB is available")
    output = Output(out, say)
    work = Path(tempfile.mkdtemp(prefix=".snapshots-bench-", dir=output.folder()))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a worker on a box: one core trains, the writer gets another
    try:
        rows = [measure(table_of[n], work, say) for n in names]
    finally:
        torch.set_num_threads(threads)
        shutil.rmtree(work, ignore_errors=True)
    doc = {"quick": quick, "torch_threads": 1, "torch": torch.__version__,
           "python": platform.python_version(), "machine": platform.machine(),
           "cpus": os.cpu_count(), "disk_dir": str(out.resolve()),
           "settings_default": {"every_steps": DEFAULTS.every_steps,
                                "every_s": DEFAULTS.every_s, "keep": DEFAULTS.keep},
           "models": rows}
    output.json("snapshots.json", doc)
    output.text("snapshots.md", table(doc))
    return doc


def _ms(s: float) -> str:
    return f"{s * 1e3:.3g}" if abs(s) < 0.1 else f"{s * 1e3:.0f}"


def _bytes(n: float) -> str:
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{n:.0f} B"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{x * 100:.3g}%"


def table(doc: dict[str, Any]) -> str:
    """Markdown: one snapshot's costs; the end-to-end runs; the default schedule's cost."""
    rows = doc["models"]
    lines = ["| model | params | snapshot file | train step ms | capture ms (step path) "
             "| hash ms | write+verify ms | writer CPU ms | peak RSS |", "|---|" + "---:|" * 8]
    for r in rows:
        b = r["background"]
        lines.append(f"| {r['model']} | {r['params']:,} | {_bytes(r['snapshot_bytes'])} "
                     f"| {_ms(r['step']['median_s'])} | {_ms(r['capture']['median_s'])} "
                     f"| {_ms(b['median_hash_s'])} | {_ms(b['median_write_s'])} "
                     f"| {_ms(b['median_cpu_s'])} | {_bytes(r['peak_rss_bytes'])} |")
    lines += ["", "End to end, snapshots on a dense schedule against none (pairs interleaved; "
              "the writer's thread competes with training for the CPU):", "",
              "| model | steps/run | due every | snapshots/run | step ms without | with "
              "| ratio min | median | max | cost per snapshot ms (median) |",
              "|---|" + "---:|" * 9]
    for r in rows:
        e = r["end_to_end"]
        cost = e["cost_per_snapshot_s"]
        lines.append(f"| {r['model']} | {e['run_steps']} | {e['every_steps']} steps "
                     f"| {', '.join(map(str, e['snapshots_per_run']))} "
                     f"| {_ms(e['mean_step_s_without']['median'])} "
                     f"| {_ms(e['mean_step_s_with']['median'])} "
                     f"| {e['ratio']['min']:.3f} | {e['ratio']['median']:.3f} "
                     f"| {e['ratio']['max']:.3f} "
                     f"| {'-' if cost is None else _ms(cost['median'])} |")
    d0 = doc["settings_default"]
    lines += ["", f"At the default settings (every_steps={d0['every_steps']}, "
              f"every_s={d0['every_s']:g}, keep={d0['keep']}):", "",
              "| model | interval steps | interval s | snapshots/h | disk written/h "
              "| disk held | step path | writer CPU (one core) | in the runs | network/h |",
              "|---|" + "---:|" * 9]
    for r in rows:
        d = r["defaults"]
        lines.append(f"| {r['model']} | {d['interval_steps']} | {d['interval_s']:.1f} "
                     f"| {d['snapshots_per_hour']:.0f} | {_bytes(d['disk_bytes_per_hour'])} "
                     f"| {_bytes(d['disk_bytes_held'])} | {_pct(d['step_path_share'])} "
                     f"| {_pct(d['writer_cpu_share'])} | {_pct(d['in_run_share'])} "
                     f"| {d['network_bytes_per_hour']} B |")
    lines += ["", "Interval: the first multiple of every_steps lasting max(every_s, the writer's "
              "time). Step path: capture / interval; writer CPU: hash + write CPU / interval; "
              "in the runs: the end-to-end cost per snapshot / interval (noisy where it is "
              "small). Peak RSS: the process's, so far. Disk held: keep snapshots and one "
              "being written. Network: none, each member writes its own copy to its own "
              "disk. One torch thread; "
              f"{doc['cpus']} CPUs; written under {doc['disk_dir']}."]
    return "\n".join(lines)
