"""Training over slow links: every-step sync against DiLoCo and streaming DiLoCo (issues 13
and 24).

    chaosctl bench slowlinks --rates 20,50,100 --seeds 0,1,2 --out bench/results/slowlinks

Each side gets its best shot before anything is reported:

- DiLoCo's outer learning rate and momentum are chosen per H from a grid on the validation
  split, on tuning seeds of their own (:mod:`.tune`, in one process with the package's outer
  step); the reported runs use the test split and other seeds.
- Every-step's all-reduce chunk is chosen by timing each of ``--chunks`` on the testbed at the
  slowest rate (``tune_steps`` steps each); every-step also runs in each ``--wires`` format
  (int8: a quarter of the bytes), each a row of its own.
- Streaming DiLoCo (``--fragments``, at every H a fragment count divides) runs with the outer
  optimizer chosen for DiLoCo at its H: a handicap, if any, of the challenger, not of the
  baselines. DiLoCo's and streaming's pseudo-gradients travel in ``--outer-wire``. With
  ``--overlap`` each streaming mode also runs with ``[training] overlap`` (each round beside
  the next step's compute), a row of its own.

Then for every link rate, seed and mode a fresh netns testbed of ``--nodes`` chaosd (a full
mesh of data links, all shaped to the rate with tbf; MQTT on the unshaped management bridge)
trains the same task (``--task``: the digits MLP or the character transformer,
:mod:`.task`): :mod:`chaos_bench.slowlinks.worker`, the same script in every mode,
with the mode set in every node's chaosd.toml (``[training] sync``, ``wire``,
``inner_steps``, ``outer_lr``, ``outer_momentum``). Background bandwidth probes are off
(``[probe] bandwidth_period_s = 0``), so the data links carry the training alone. (Until stop
52 the bench set a day-long period instead; the probe ramp then sent a 16 MiB test on a link
within seconds of its first, into the timed steps of the short runs.)

Every node joins first; then the bench names the global step ``START`` at which every worker
begins to train (until then they run no-sample steps that move nothing) and each trains
``--steps`` steps of ``--batch`` samples. The report (:mod:`chaos_bench.slowlinks.report`)
gives the wall time of those steps, the time to ``--target-acc`` on the test split, the
bytes each node's data links sent, and the final test and validation accuracy and loss, per
run and as the spread over the seeds; ``slowlinks.json`` (every run, and both tunings) and,
with matplotlib, ``slowlinks.png`` (loss against wall time and against bytes) go to ``--out``.
"""

from __future__ import annotations

import json
import math
import platform
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos_bench.output import keep_copy
from chaos_bench.progress import Say
from chaos_bench.slowlinks import report, tune
from chaos_bench.workers import join_all, max_step
from chaosctl.testbed.core import Testbed

WORKER_MODULE = "chaos_bench.slowlinks.worker"
RUN_TIMEOUT_S = 900.0
PROGRESS_S = 15.0
# Steps between the bench's view of the cluster and START: at least ~3 s of warm-up steps
# (every-step: a shaped round each, ~0.1-0.4 s; diloco: 0.05 s each) so every worker reads
# START before it gets there.
MARGIN = {"every-step": 10, "diloco": 60}


@dataclass(frozen=True)
class Options:
    """One bench run (the CLI's options). A tuple of several ``outer_lrs``/``outer_momenta``
    is a grid (chosen on the validation split, :mod:`.tune`); of several ``chunks``, chunk
    sizes timed on the testbed before the runs (the fastest is every-step's)."""

    rates: tuple[float, ...] = (20.0, 50.0, 100.0)
    inner_steps: tuple[int, ...] = (20, 50)
    steps: int = 300
    nodes: int = 3
    batch: int = 32
    lr: float = 1e-3
    target_acc: float = 0.95
    outer_lrs: tuple[float, ...] = (0.7,)
    outer_momenta: tuple[float, ...] = (0.9,)
    eval_every: int = 10
    seeds: tuple[int, ...] = (0,)
    chunks: tuple[int, ...] = (0,)
    wires: tuple[str, ...] = ("fp32",)
    tune_steps: int = 60
    fragments: tuple[int, ...] = ()
    outer_wire: str = "fp32"
    overlap: bool = False
    task: str = "digits"


@dataclass(frozen=True)
class Mode:
    """One sync configuration: every-step in a wire format, or DiLoCo at one H (streaming:
    in ``fragments`` parts)."""

    name: str
    inner_steps: int = 1
    wire: str = "fp32"
    chunk: int = 0
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    fragments: int = 1
    overlap: bool = False


def modes(opts: Options, chunk: int = 0,
          outer: dict[int, tuple[float, float]] | None = None) -> list[Mode]:
    """Every run at one rate and seed: every-step in each wire format (chunked at ``chunk``
    bytes), then DiLoCo at each H with its outer (lr, momentum) from ``outer``."""
    out = [Mode("every-step" if w == "fp32" else f"every-step {w}", 1, w, chunk)
           for w in opts.wires]
    wire = "" if opts.outer_wire == "fp32" else f" {opts.outer_wire}"
    for h in opts.inner_steps:
        lr, mu = (outer or {}).get(h, (opts.outer_lrs[0], opts.outer_momenta[0]))
        out.append(Mode(f"diloco H={h}{wire}", h, opts.outer_wire, outer_lr=lr,
                        outer_momentum=mu))
        for p in (p for p in opts.fragments if h % p == 0):
            out.append(Mode(f"streaming H={h} P={p}{wire}", h, opts.outer_wire, outer_lr=lr,
                            outer_momentum=mu, fragments=p))
            if opts.overlap and h // p >= 2:
                out.append(Mode(f"streaming H={h} P={p}{wire} overlap", h, opts.outer_wire,
                                outer_lr=lr, outer_momentum=mu, fragments=p, overlap=True))
    return out


def config_of(mode: Mode) -> str:
    """The chaosd.toml tables of a run (after the testbed's secret)."""
    text = "[probe]\nbandwidth_period_s = 0.0\n[training]\n"
    if mode.inner_steps > 1:
        sync = "streaming" if mode.fragments > 1 else "diloco"
        text += (f'sync = "{sync}"\ninner_steps = {mode.inner_steps}\n'
                 f"outer_lr = {mode.outer_lr}\nouter_momentum = {mode.outer_momentum}\n")
        if mode.fragments > 1:
            text += f"fragments = {mode.fragments}\n"
        if mode.overlap:
            text += "overlap = true\n"
    if mode.wire != "fp32":
        text += f'wire = "{mode.wire}"\n'
    return text


def run_one(rate: float, mode: Mode, seed: int, steps: int, opts: Options, say: Say,
            out: Path, workdir: Path | None = None) -> dict[str, Any]:
    """Train ``steps`` steps once at ``rate`` Mbit/s in ``mode`` from ``seed``; returns the
    workers' documents.

    On a failure the testbed's logs are kept under ``out/failed-<rate>-<mode>-s<seed>``."""
    tmp = Path(tempfile.mkdtemp(prefix="slow-", dir=workdir))  # short: socket paths
    run_dir = tmp / "run"
    run_dir.mkdir()
    h, name = mode.inner_steps, mode.name
    tb = Testbed(tmp / "tb", nodes=opts.nodes, topology="full", bw=(rate, rate), seed=1,
                 config=config_of(mode))
    cmd = [sys.executable, "-m", WORKER_MODULE, "--dir", str(run_dir), "--steps",
           str(steps), "--batch", str(opts.batch), "--lr", str(opts.lr),
           "--eval-every", str(opts.eval_every), "--eval-node", tb.nodes[0],
           "--seed", str(seed), "--chunk", str(mode.chunk), "--task", opts.task]
    try:
        tb.up(wait_s=60.0)
        join_all(tb, cmd)
        unit = h if h > 1 else 1
        margin = MARGIN["diloco" if h > 1 else "every-step"]
        start = math.ceil((max_step(tb) + margin) / unit) * unit
        (run_dir / "start").write_text(str(start))
        say(f"  {rate:g} Mbit/s {name} seed {seed}: {opts.nodes} nodes joined; training "
            f"steps {start}..{start + steps}")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        next_note = time.monotonic() + PROGRESS_S
        while not all((run_dir / f"{n}.json").exists() for n in tb.nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not finish within {RUN_TIMEOUT_S:g}s; "
                                   f"see {tb.dir}")
            if time.monotonic() > next_note:
                say(f"    step {max_step(tb) - start}/{steps}")
                next_note += PROGRESS_S
            time.sleep(0.5)
        docs = {n: json.loads((run_dir / f"{n}.json").read_text()) for n in tb.nodes}
    except BaseException:
        keep = out / f"failed-{rate:g}-{name.replace(' ', '').replace('=', '')}-s{seed}"
        keep_copy(tmp, keep, say, "the logs of the failed run")
        raise
    finally:
        tb.down(grace_s=5.0)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rate_mbps": rate, "mode": name, "inner_steps": h, "seed": seed,
            "config": asdict(mode), "start": start, "nodes": docs}


def tune_chunk(opts: Options, say: Say, out: Path, workdir: Path | None
               ) -> tuple[int, list[dict[str, Any]]]:  # fmt: skip
    """The every-step chunk: each of ``opts.chunks`` timed over ``tune_steps`` steps at the
    slowest rate, on the first tuning seed; the fastest wins (one size: no runs)."""
    if len(opts.chunks) == 1:
        return opts.chunks[0], []
    rate, trials = min(opts.rates), []
    for chunk in opts.chunks:
        doc = run_one(rate, Mode(f"every-step chunk {chunk}", chunk=chunk), tune.TUNE_SEEDS[0],
                      opts.tune_steps, opts, say, out, workdir)
        wall = next(d for d in doc["nodes"].values() if d["evals"])["wall_s"]
        trials.append({"chunk": chunk, "rate_mbps": rate, "steps": opts.tune_steps,
                       "wall_s": wall})
        say(f"  chunk {chunk or 'default'}: {wall:.1f} s for {opts.tune_steps} steps")
    best = min(trials, key=lambda t: t["wall_s"])
    return int(best["chunk"]), trials


def tune_outer(opts: Options, say: Say) -> tuple[dict[int, tuple[float, float]],
                                                 dict[str, Any]]:
    """Each H's outer (lr, momentum) from the grid, on the validation split (:mod:`.tune`)."""
    if len(opts.outer_lrs) * len(opts.outer_momenta) == 1 or not opts.inner_steps:
        return {}, {}
    grid = tune.sweep(opts.inner_steps, opts.outer_lrs, opts.outer_momenta, steps=opts.steps,
                      nodes=opts.nodes, batch=opts.batch, lr=opts.lr, say=say,
                      task=opts.task)
    best = {h: tune.choose(pts) for h, pts in grid.items()}
    chosen = {h: (b.outer_lr, b.outer_momentum) for h, b in best.items()}
    doc = {"seeds": list(tune.TUNE_SEEDS), "criterion": "mean final validation loss",
           "points": [{**asdict(p), "mean_loss": p.mean_loss}
                      for pts in grid.values() for p in pts],
           "chosen": {str(h): {"outer_lr": lr, "outer_momentum": mu}
                      for h, (lr, mu) in chosen.items()}}
    return chosen, doc


def run(opts: Options, out: Path, say: Say, workdir: Path | None = None) -> dict[str, Any]:
    """Tune, then every rate x seed x mode; writes ``slowlinks.json`` (and the plot)."""
    outer, outer_doc = tune_outer(opts, say)
    chunk, chunk_trials = tune_chunk(opts, say, out, workdir)
    runs = []
    for rate in opts.rates:
        for seed in opts.seeds:
            for mode in modes(opts, chunk, outer):
                runs.append(run_one(rate, mode, seed, opts.steps, opts, say, out, workdir))
    doc = report.analyse(runs, opts.target_acc)
    doc["options"] = asdict(opts)
    doc["tuning"] = {"outer": outer_doc, "chunk": {"chosen": chunk, "trials": chunk_trials}}
    doc["host"] = {"machine": platform.machine(), "python": platform.python_version(),
                   "note": "a shared 2-core box: wall times are noisy"}
    report.write(doc, out, say)
    return doc
