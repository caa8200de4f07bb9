"""The policy controller against every fixed policy, while the links change (issue 24).

    chaosctl bench adaptive --seeds 0,1,2 --out bench/results/adaptive

Each run is a fresh netns testbed of ``--nodes`` chaosd (a full mesh of data links; MQTT on
the unshaped management bridge) training the same task (:mod:`chaos_bench.adaptive.worker`,
a character transformer) under one *policy*:

- ``adaptive``: the policy controller on (``[adaptive] enabled``, its shipped bounds: sync
  every-step or DiLoCo with H up to 100, wire down to int8), starting from every-step fp32.
  Two knobs are shortened for phases of seconds, not hours, and are the same in every
  adaptive run: ``dwell`` (measurements in a row) and ``min_interval_s`` (between switches).
- ``every-step``, ``every-step int8``: every step, fp32 and int8 on the wire (the Trainer's
  default chunking);
- ``diloco``: DiLoCo at ``--inner-steps``; ``streaming``: streaming DiLoCo at that H in
  ``--fragments`` parts; their pseudo-gradients in ``--outer-wire``.

DiLoCo's outer optimizer is the package's default (Nesterov, lr 0.7, momentum 0.9: the DiLoCo
paper's) in the fixed runs and in the controller's; it was not tuned on this task, for any
side. Background bandwidth probes run in every run (``--probe-s``), since the controller needs
them; they take the same share of the links from every policy.

The run follows a wall-clock schedule (``--phases``): each phase sets every data link's rate
(``RATE``), optionally the last node's links to another (``/EDGE``) and slows the last node's
compute by some milliseconds a step (``+MS``), for some seconds (``xSECONDS``). The default,
``1000x20,20x20,200/5x20,1000+150x20``, is the issue's: fast links, a slow WAN, fast links
with one box on a 5 Mbit/s uplink, fast links again while one box computes slowly. Every
node joins first; the bench then names the step ``START`` at which every worker begins to
train, and the schedule starts when the first worker gets there. When it ends the eval node
saves the shared parameters one last time and the testbed is torn down.

Nothing is evaluated inside the timed schedule: the eval node saves the parameters the members
share every few seconds, and the bench evaluates them on the validation split afterwards. The
report (:mod:`chaos_bench.adaptive.report`): per policy, the wall time to ``--target-loss``
(validation), the final validation loss, the steps per second in each phase (with the spread
over seeds), every switch the controller made with its predicted and measured step time, and
a timeline plot of the link rates, the losses and the controller's choices.
"""

from __future__ import annotations

import functools
import json
import math
import platform
import re
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from chaos_bench.adaptive import report
from chaos_bench.output import keep_copy
from chaos_bench.progress import Say
from chaos_bench.workers import join_all, max_step, records
from chaosctl.polling import wait_until
from chaosctl.testbed.core import Testbed

WORKER_MODULE = "chaos_bench.adaptive.worker"
POLICIES = ("adaptive", "every-step", "every-step int8", "diloco", "streaming")
DEFAULT_PHASES = "1000x20,20x20,200/5x20,1000+150x20"
START_WAIT_S = 120.0
FINAL_WAIT_S = 120.0  # a last step on a 5 Mbit/s link, after the schedule
PROGRESS_S = 15.0
MARGIN = {"every-step": 10, "diloco": 60}  # warm-up steps before START (see slowlinks)
PHASE = re.compile(r"^(?P<mbit>\d+(?:\.\d+)?)(?:/(?P<edge>\d+(?:\.\d+)?))?"
                   r"(?:\+(?P<slow>\d+(?:\.\d+)?))?x(?P<s>\d+(?:\.\d+)?)$")


@dataclass(frozen=True)
class Phase:
    """A stretch of the schedule: the links' rates and the last node's compute."""

    seconds: float
    mbit: float  # every data link
    edge_mbit: float | None = None  # the last node's links, when they differ
    slow_ms: float = 0.0  # extra compute per step on the last node

    def label(self) -> str:
        text = f"{self.mbit:g} Mbit/s"
        if self.edge_mbit is not None:
            text += f", last node {self.edge_mbit:g}"
        if self.slow_ms:
            text += f", last node +{self.slow_ms:g} ms/step"
        return text


def parse_phases(text: str) -> tuple[Phase, ...]:
    """``RATE[/EDGE][+MS]xSECONDS``, comma-separated; ValueError with one line otherwise."""
    out = []
    for part in (p.strip() for p in text.split(",") if p.strip()):
        m = PHASE.match(part)
        if m is None:
            raise ValueError(f"--phases: {part!r} is not RATE[/EDGE_RATE][+SLOW_MS]xSECONDS "
                             f"(e.g. 200/5x30)")
        ph = Phase(float(m["s"]), float(m["mbit"]),
                   float(m["edge"]) if m["edge"] else None, float(m["slow"] or 0))
        if not 0.1 <= ph.mbit <= 10_000 or not 0.1 <= (ph.edge_mbit or 1) <= 10_000:
            raise ValueError(f"--phases: {part!r}: a rate must be 0.1 to 10000 Mbit/s")
        if not 5 <= ph.seconds <= 3600 or ph.slow_ms > 10_000:
            raise ValueError(f"--phases: {part!r}: a phase lasts 5 to 3600 s, and slows a "
                             f"step by at most 10000 ms")
        out.append(ph)
    if not out:
        raise ValueError("--phases: no phase given")
    return tuple(out)


@dataclass(frozen=True)
class Options:
    """One bench run (the CLI's options)."""

    policies: tuple[str, ...] = POLICIES
    phases: tuple[Phase, ...] = parse_phases(DEFAULT_PHASES)
    seeds: tuple[int, ...] = (0, 1, 2)
    nodes: int = 3
    batch: int = 16
    lr: float = 1e-3
    inner_steps: int = 20
    fragments: int = 5
    outer_wire: str = "int8"
    target_loss: float = 2.4
    probe_s: float = 5.0
    dwell: int = 2
    min_interval_s: float = 10.0
    snap_every_s: float = 3.0


def config_of(policy: str, opts: Options) -> str:
    """The chaosd.toml tables of a run (after the testbed's secret)."""
    text = f"[probe]\nbandwidth_period_s = {opts.probe_s}\n[training]\n"
    if policy == "every-step int8":
        text += 'wire = "int8"\n'
    elif policy in ("diloco", "streaming"):
        text += (f'sync = "{policy}"\ninner_steps = {opts.inner_steps}\n'
                 f'wire = "{opts.outer_wire}"\n')
        if policy == "streaming":
            text += f"fragments = {opts.fragments}\n"
    elif policy == "adaptive":
        text += (f"[adaptive]\nenabled = true\ndwell = {opts.dwell}\n"
                 f"min_interval_s = {opts.min_interval_s}\n")
    return text


def _period(policy: str, opts: Options) -> int:
    return {"diloco": opts.inner_steps,
            "streaming": opts.inner_steps // opts.fragments}.get(policy, 1)


def apply(tb: Testbed, phase: Phase, run_dir: Path) -> None:
    """Shape every data link for ``phase`` and set the last node's compute slow-down."""
    last = tb.nodes[-1]
    for a, b in tb.links:
        on_edge = phase.edge_mbit is not None and last in (a, b)
        tb.shape(a, b, (phase.edge_mbit or phase.mbit) if on_edge else phase.mbit)
    slow = run_dir / f"slow-{last}"
    if phase.slow_ms:
        slow.write_text(f"{phase.slow_ms:g}")
    else:
        slow.unlink(missing_ok=True)


def run_one(policy: str, seed: int, opts: Options, say: Say, out: Path,
            workdir: Path | None = None) -> dict[str, Any]:
    """One policy, one seed, through the whole schedule; the run's raw record.

    On a failure the testbed's logs are kept under ``out/failed-<policy>-s<seed>``."""
    tmp = Path(tempfile.mkdtemp(prefix="adapt-", dir=workdir))  # short: socket paths
    run_dir = tmp / "run"
    run_dir.mkdir()
    first = opts.phases[0]
    tb = Testbed(tmp / "tb", nodes=opts.nodes, topology="full", bw=(first.mbit, first.mbit),
                 seed=1, config=config_of(policy, opts))
    cmd = [sys.executable, "-m", WORKER_MODULE, "--dir", str(run_dir), "--batch",
           str(opts.batch), "--lr", str(opts.lr), "--seed", str(seed), "--eval-node",
           tb.nodes[0], "--snap-every-s", str(opts.snap_every_s)]
    phases: list[dict[str, Any]] = []
    try:
        tb.up(wait_s=60.0)
        apply(tb, first, run_dir)
        join_all(tb, cmd)
        unit = _period(policy, opts)
        margin = MARGIN["every-step" if unit == 1 else "diloco"]
        start = math.ceil((max_step(tb) + margin) / unit) * unit
        (run_dir / "start").write_text(str(start))
        wait_until((run_dir / "snap-0000.pt").exists, START_WAIT_S,
                   f"the eval node to reach step {start}", every=0.05)
        t0 = time.time()
        say(f"  {policy} seed {seed}: {opts.nodes} nodes training from step {start}")
        for i, ph in enumerate(opts.phases):
            began = time.time()
            if i:
                apply(tb, ph, run_dir)
            phases.append({**asdict(ph), "t0": round(began - t0, 3)})
            end = t0 + sum(p.seconds for p in opts.phases[: i + 1])
            while (left := end - time.time()) > 0:
                time.sleep(min(left, PROGRESS_S))
                say(f"    phase {i + 1}/{len(opts.phases)} ({ph.label()}): step "
                    f"{max_step(tb) - start}")
            phases[-1]["t1"] = round(time.time() - t0, 3)
        (run_dir / "stop").touch()
        wait_until((run_dir / "final").exists, FINAL_WAIT_S,
                   "the eval node's final snapshot", every=0.05)
        events = [e for e in tb.query(tb.nodes[0], "events", timeout=5.0) or []
                  if e.get("kind") in ("policy-changed", "node-failed", "scale-in", "straggler")]
    except BaseException:
        keep_copy(tmp, out / f"failed-{policy.replace(' ', '-')}-s{seed}", say,
                  "the logs of the failed run")
        raise
    finally:
        tb.down(grace_s=5.0)
    try:
        steps = {n: _steps(records(run_dir / f"{n}.steps.jsonl"), t0) for n in tb.nodes}
        evals = evaluate(run_dir, t0)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    for e in events:
        e["t"] = round(float(e.get("ts") or 0) - t0, 3)
    return {"policy": policy, "seed": seed, "start": start, "config": config_of(policy, opts),
            "phases": phases, "evals": evals, "events": events, "nodes": steps}


def _steps(rows: list[dict[str, Any]], t0: float) -> dict[str, Any]:
    """A node's step log, compact: ``[step, t]`` pairs (seconds since the schedule began)
    and ``[step, mode]`` where the sync mode changed."""
    pairs, modes, last = [], [], None
    for r in rows:
        pairs.append([r["step"], round(r["t"] - t0, 4)])
        if r["mode"] != last:
            modes.append([r["step"], r["mode"]])
            last = r["mode"]
    return {"steps": pairs, "modes": modes}


@functools.cache
def _task() -> tuple[Any, Any]:
    from chaos_bench.adaptive.worker import CHARS, CONTEXT, MODEL
    from chaos_edge.examples import chartf

    data = chartf.load(CHARS, CONTEXT)
    return data, chartf.CharTransformer(len(data.vocab), data.context, **MODEL)


def evaluate(run_dir: Path, t0: float) -> list[dict[str, Any]]:
    """Validation loss and accuracy of every saved snapshot, in order."""
    import torch

    from chaos_edge.examples import chartf

    data, model = _task()
    out = []
    for path in sorted(run_dir.glob("snap-*.pt")):
        snap = torch.load(path, weights_only=True)
        torch.nn.utils.vector_to_parameters(snap["params"], model.parameters())
        loss, acc = chartf.evaluate(model, data)
        out.append({"step": int(snap["step"]), "t": round(float(snap["t"]) - t0, 3),
                    "final": bool(snap["final"]), "val_loss": round(loss, 5),
                    "val_acc": round(acc, 5)})
    return out


def run(opts: Options, out: Path, say: Say, workdir: Path | None = None) -> dict[str, Any]:
    """Every seed x policy (seeds outermost, so a cut-short bench has whole seeds); writes
    ``adaptive.json``, ``adaptive.md`` and the timeline plot."""
    runs: list[dict[str, Any]] = []
    total = len(opts.seeds) * len(opts.policies)
    for seed in opts.seeds:
        for policy in opts.policies:
            say(f"run {len(runs) + 1}/{total}: {policy}, seed {seed}")
            runs.append(run_one(policy, seed, opts, say, out, workdir))
            # The raw runs so far, so an interrupted bench keeps what it measured.
            out.mkdir(parents=True, exist_ok=True)
            (out / "adaptive-runs.json").write_text(json.dumps(runs) + "\n")
    doc = report.analyse(runs, opts.target_loss)
    doc["options"] = {**asdict(opts), "phases": [asdict(p) for p in opts.phases]}
    doc["host"] = {"machine": platform.machine(), "python": platform.python_version(),
                   "note": "a shared 2-core box: wall times are noisy"}
    report.write(doc, out, say)
    (out / "adaptive-runs.json").unlink(missing_ok=True)  # adaptive.json holds every run
    return doc


def reanalyse(source: Path, out: Path, say: Say, target: float | None = None
              ) -> dict[str, Any]:  # fmt: skip
    """The report again from the raw runs of an earlier ``adaptive.json`` (``--from``), with
    this version's analysis and, if given, another target; the runs themselves unchanged."""
    try:
        old = json.loads(source.read_text())
        runs = old["runs"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"--from {source}: not an adaptive.json with its runs ({exc})"
                         ) from None
    doc = report.analyse(runs, old["target_loss"] if target is None else target)
    doc["options"], doc["host"] = old.get("options"), old.get("host")
    doc["reanalysed_from"] = str(source)
    report.write(doc, out, say)
    return doc
