"""Training over slow links: every-step sync against DiLoCo (issue 13).

    chaosctl bench slowlinks --rates 20,50,100 --inner-steps 20,50 --out bench/results/slowlinks

For every link rate and every sync mode (``every-step``, and ``diloco`` at each H of
``--inner-steps``) a fresh netns testbed of ``--nodes`` chaosd (a full mesh of data links, all
shaped to the rate with tbf; MQTT on the unshaped management bridge) trains the same task:
:mod:`chaos_bench.slowlinks.worker`, the same script in every mode, with the mode set in
every node's chaosd.toml (``[training] sync``, ``inner_steps``). Bandwidth probes are off
during the runs (``[probe] bandwidth_period_s``), so the data links carry the training alone.

Every node joins first; then the bench names the global step ``START`` at which every worker
begins to train (until then they run no-sample steps that move nothing) and each trains
``--steps`` steps of ``--batch`` samples. The report (:mod:`chaos_bench.slowlinks.report`)
gives the wall time of those steps, the time to ``--target-acc`` on the held-out split, the
bytes each node's data links sent, and the final test accuracy and loss; ``slowlinks.json``
and, with matplotlib, ``slowlinks.png`` (loss against wall time and against bytes) go to
``--out``.
"""

from __future__ import annotations

import functools
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
from chaos_bench.slowlinks import report
from chaosctl.testbed.core import Testbed

WORKER_MODULE = "chaos_bench.slowlinks.worker"
JOIN_WAIT_S = 240.0  # a shared, loaded box has taken over 120 s for one join
RUN_TIMEOUT_S = 900.0
PROGRESS_S = 15.0
# Steps between the bench's view of the cluster and START: at least ~3 s of warm-up steps
# (every-step: a shaped round each, ~0.1-0.4 s; diloco: 0.05 s each) so every worker reads
# START before it gets there.
MARGIN = {"every-step": 10, "diloco": 60}


@dataclass(frozen=True)
class Options:
    """One bench run (the CLI's options)."""

    rates: tuple[float, ...] = (20.0, 50.0, 100.0)
    inner_steps: tuple[int, ...] = (20, 50)
    steps: int = 300
    nodes: int = 3
    batch: int = 32
    lr: float = 1e-3
    target_acc: float = 0.95
    outer_lr: float = 0.7
    outer_momentum: float = 0.9
    eval_every: int = 10


def modes(opts: Options) -> list[tuple[str, int]]:
    """(mode name, H) of every run at one rate; H is 1 for every-step."""
    return [("every-step", 1)] + [(f"diloco H={h}", h) for h in opts.inner_steps]


def config_of(h: int, opts: Options) -> str:
    """The chaosd.toml tables of a run (after the testbed's secret)."""
    text = "[probe]\nbandwidth_period_s = 86400.0\n"
    if h > 1:
        text += (f'[training]\nsync = "diloco"\ninner_steps = {h}\n'
                 f"outer_lr = {opts.outer_lr}\nouter_momentum = {opts.outer_momentum}\n")
    return text


def _member(tb: Testbed, node: str) -> bool:
    rows = tb.query(tb.nodes[0], "nodes") or []
    return any(r.get("id") == node and r.get("state") == "active" for r in rows)


def _max_step(tb: Testbed) -> int:
    return max((int(r.get("step") or 0) for r in tb.query(tb.nodes[0], "nodes") or []),
               default=0)


def run_one(rate: float, name: str, h: int, opts: Options, say: Say, out: Path,
            workdir: Path | None = None) -> dict[str, Any]:
    """Train once at ``rate`` Mbit/s in mode ``name``; returns the workers' documents.

    On a failure the testbed's logs are kept under ``out/failed-<rate>-<mode>``."""
    tmp = Path(tempfile.mkdtemp(prefix="slow-", dir=workdir))  # short: socket paths
    run_dir = tmp / "run"
    run_dir.mkdir()
    tb = Testbed(tmp / "tb", nodes=opts.nodes, topology="full", bw=(rate, rate), seed=1,
                 config=config_of(h, opts))
    cmd = [sys.executable, "-m", WORKER_MODULE, "--dir", str(run_dir), "--steps",
           str(opts.steps), "--batch", str(opts.batch), "--lr", str(opts.lr),
           "--eval-every", str(opts.eval_every), "--eval-node", tb.nodes[0]]
    try:
        tb.up(wait_s=60.0)
        for node in tb.nodes:  # one at a time: the first bootstraps, the others join it
            tb.join(node, cmd, timeout=10)
            tb.wait(functools.partial(_member, tb, node), JOIN_WAIT_S, f"{node} to train")
        unit = h if h > 1 else 1
        margin = MARGIN["diloco" if h > 1 else "every-step"]
        start = math.ceil((_max_step(tb) + margin) / unit) * unit
        (run_dir / "start").write_text(str(start))
        say(f"  {rate:g} Mbit/s {name}: {opts.nodes} nodes joined; training steps "
            f"{start}..{start + opts.steps}")
        deadline = time.monotonic() + RUN_TIMEOUT_S
        next_note = time.monotonic() + PROGRESS_S
        while not all((run_dir / f"{n}.json").exists() for n in tb.nodes):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the workers did not finish within {RUN_TIMEOUT_S:g}s; "
                                   f"see {tb.dir}")
            if time.monotonic() > next_note:
                say(f"    step {_max_step(tb) - start}/{opts.steps}")
                next_note += PROGRESS_S
            time.sleep(0.5)
        docs = {n: json.loads((run_dir / f"{n}.json").read_text()) for n in tb.nodes}
    except BaseException:
        keep = out / f"failed-{rate:g}-{name.replace(' ', '').replace('=', '')}"
        keep_copy(tmp, keep, say, "the logs of the failed run")
        raise
    finally:
        tb.down(grace_s=5.0)
        shutil.rmtree(tmp, ignore_errors=True)
    return {"rate_mbps": rate, "mode": name, "inner_steps": h, "start": start, "nodes": docs}


def run(opts: Options, out: Path, say: Say, workdir: Path | None = None) -> dict[str, Any]:
    """Every rate x mode; writes ``slowlinks.json`` (and the plot) under ``out``."""
    runs = []
    for rate in opts.rates:
        for name, h in modes(opts):
            runs.append(run_one(rate, name, h, opts, say, out, workdir))
    doc = report.analyse(runs, opts.target_acc)
    doc["options"] = asdict(opts)
    doc["host"] = {"machine": platform.machine(), "python": platform.python_version(),
                   "note": "a shared 2-core box: wall times are noisy"}
    report.write(doc, out, say)
    return doc
