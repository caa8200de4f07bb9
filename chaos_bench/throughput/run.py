"""Steps per second: torch DDP over gloo against Chaos, the same training, one after the other.

    chaosctl bench throughput --model cnn --nodes 3 --repeats 3 --out bench/results/throughput

Each repeat runs every arm in turn (``ddp``, ``chaos``, ``chaos-overlap``, ``chaos-ddp``;
:mod:`.worker`) with ``--nodes`` members on this box, one torch thread each: the same model,
batch, optimizer and data, so that only the gradient exchange differs. DDP runs as a DDP user
runs it: ``init_process_group("gloo")`` and ``DistributedDataParallel`` with its defaults (25 MB
buckets, overlapped with the backward pass) and ``gradient_as_bucket_view=True``. The Chaos
arms run on a real local cluster (a broker, a chaosd per member, workers through ``chaosctl
join``) and start timing once every member is in. Each worker times ``--steps`` steps after
``--warmup``; an arm's rate in a repeat is ``steps`` over the median of its members' timed
seconds. The ratio of each Chaos arm to DDP
is taken within a repeat (so a slower box slows both), and reported as the median and the
range over the repeats.

With ``--mbit R`` every arm runs on the netns testbed instead (root): one namespace per member,
a full mesh of veths shaped to ``R`` Mbit/s with tbf (with ``--mbit-max H`` too: each link to
its own rate, drawn between ``R`` and ``H`` with seed 1, the same for every arm), the Chaos
arms' chaosd in the namespaces, and DDP's gloo bound to each node's data address (a process
group built as ``init_process_group`` builds it, on that address).

Writes ``throughput.json`` (every worker's per-step times), ``throughput.md`` and, with
matplotlib, ``throughput.png``.
"""

from __future__ import annotations

import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from chaos_bench.output import Output, keep_copy
from chaos_bench.progress import Say
from chaos_bench.workers import reap
from chaosctl.client import CtlError, call_once
from chaosctl.cluster import LocalCluster, free_port

WORKER = "chaos_bench.throughput.worker"
WAIT_S = 600.0  # the slowest arm's run (dense-25m, 3 members) is about two minutes
DDP_PORT = 29500  # the store's port on the testbed (each namespace has its own ports)


def _argv(arm: str, model: str, batch: int, warmup: int, steps: int, world: int,
          out: Path) -> list[str]:  # fmt: skip
    return [sys.executable, "-m", WORKER, "--arm", arm, "--model", model, "--batch",
            str(batch), "--warmup", str(warmup), "--steps", str(steps), "--world", str(world),
            "--out", str(out)]


def _collect(outs: list[Path], alive: Any, what: str) -> list[dict[str, Any]]:
    """Every worker's result once all are written; ``alive()`` says whether to wait on."""
    deadline = time.monotonic() + WAIT_S
    while not all(p.exists() for p in outs):
        if time.monotonic() > deadline or not alive():
            missing = [p.stem for p in outs if not p.exists()]
            raise CtlError(f"{what}: no result from {', '.join(missing)} (see the logs)")
        time.sleep(0.2)
    time.sleep(0.1)  # a file is written in one call; let the last one finish
    return [json.loads(p.read_text()) for p in outs]


def run_ddp(model: str, nodes: int, batch: int, warmup: int, steps: int,
            work: Path) -> list[dict[str, Any]]:  # fmt: skip
    """The DDP arm: ``nodes`` processes, a gloo group over a TCP store on loopback."""
    port = free_port()
    outs = [work / f"ddp-{r}.json" for r in range(nodes)]
    procs = []
    try:
        for r in range(nodes):
            with open(work / f"ddp-{r}.log", "ab") as log:
                procs.append(subprocess.Popen(
                    [*_argv("ddp", model, batch, warmup, steps, nodes, outs[r]),
                     "--rank", str(r), "--port", str(port)],
                    stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True))
        return _collect(outs, lambda: all(p.poll() in (None, 0) for p in procs), "ddp")
    finally:
        for p in procs:
            reap(p, 10.0)


def _config(wire: str) -> str:
    """chaosd's configuration for the Chaos arms: the rounds' wire format."""
    return f'[training]\nwire = "{wire}"\n'


def _testbed(work: Path, name: str, nodes: int, bw: tuple[float, float],
             run_id: str | None, wire: str = "fp32") -> Any:  # fmt: skip
    """A full mesh of namespaces, each link shaped (tbf) to a rate drawn from ``bw`` with seed
    1: the same rates for every arm (:func:`link_rates`)."""
    from chaosctl.testbed.core import Testbed

    return Testbed(work / name, nodes, "full", bw, seed=1, run_id=run_id, config=_config(wire))


def link_rates(nodes: int, bw: tuple[float, float]) -> dict[str, float]:
    """The rate of every link of the testbed :func:`_testbed` builds, by ``"a-b"``."""
    from chaosctl.testbed import topo

    plan = topo.Plan.make(nodes, "full", bw, 1)
    return {f"{a}-{b}": round(plan.rates[(a, b)], 1) for a, b in plan.links}


def _gone(prefix: str) -> None:
    from netprobe import netns

    left = netns.list_netns(prefix) + netns.list_links(prefix)
    if left:
        raise CtlError(f"the testbed left {', '.join(left)} behind")


def run_ddp_netns(model: str, nodes: int, batch: int, warmup: int, steps: int, work: Path,
                  bw: tuple[float, float], run_id: str | None
                  ) -> list[dict[str, Any]]:  # fmt: skip
    """The DDP arm on the testbed: a process in each namespace, gloo on the data addresses."""
    outs = [work / f"ddp-{r}.json" for r in range(nodes)]
    procs: list[subprocess.Popen[bytes]] = []
    tb = _testbed(work, "tb-ddp", nodes, bw, run_id)
    try:
        with tb:
            tb.up(start_daemons=False)
            master = tb.addr_of(tb.nodes[0])
            for r, node in enumerate(tb.nodes):
                with open(work / f"ddp-{r}.log", "ab") as log:
                    procs.append(tb.exec(node, [
                        *_argv("ddp", model, batch, warmup, steps, nodes, outs[r]),
                        "--rank", str(r), "--port", str(DDP_PORT), "--host", tb.addr_of(node),
                        "--master", master], stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                        start_new_session=True))
            return _collect(outs, lambda: all(p.poll() in (None, 0) for p in procs), "ddp")
    finally:
        for p in procs:
            reap(p, 10.0)
        _gone(tb.state.prefix)


def run_chaos_netns(arm: str, model: str, nodes: int, batch: int, warmup: int, steps: int,
                    work: Path, bw: tuple[float, float], run_id: str | None, say: Say,
                    wire: str = "fp32") -> list[dict[str, Any]]:  # fmt: skip
    """A Chaos arm on the testbed: a chaosd per namespace, the workers joined through them."""
    outs = [work / f"{arm}-{i + 1}.json" for i in range(nodes)]
    tb = _testbed(work, f"tb-{arm}", nodes, bw, run_id, wire)
    try:
        with tb:
            tb.up()
            ids = tb.nodes

            def active(want: list[str]) -> bool:
                rows = {r["id"]: r["state"] for r in tb.query(ids[0], "nodes") or []}
                return all(rows.get(n) == "active" for n in want)

            tb.join(ids[0], _argv(arm, model, batch, warmup, steps, nodes, outs[0]))
            tb.wait(lambda: active(ids[:1]), 120, f"{ids[0]} active")
            for i in range(1, nodes):
                tb.join(ids[i], _argv(arm, model, batch, warmup, steps, nodes, outs[i]))
            say(f"{arm}: {nodes} members joining on the testbed, then {warmup} + {steps} steps")
            return _collect(outs, lambda: True, arm)
    finally:
        _gone(tb.state.prefix)


def run_chaos(arm: str, model: str, nodes: int, batch: int, warmup: int, steps: int,
              work: Path, say: Say, wire: str = "fp32") -> list[dict[str, Any]]:  # fmt: skip
    """A Chaos arm on a local cluster: the first worker bootstraps, the rest join it."""
    kind = "mosquitto" if shutil.which("mosquitto") or Path("/usr/sbin/mosquitto").exists() \
        else "embedded"
    outs = [work / f"{arm}-{i + 1}.json" for i in range(nodes)]
    with LocalCluster(work / f"c-{arm}", nodes, cluster="tput", broker_kind=kind,
                      config=_config(wire)) as c:
        c.start()
        c.wait(lambda: c.agreed(), 30, "a scheduler")
        ids = c.node_ids

        def active(want: list[str]) -> bool:
            rows = {r["id"]: r["state"] for r in c.query(ids[0], "nodes") or []}
            return all(rows.get(n) == "active" for n in want)

        def join(i: int) -> None:
            call_once(c.socket_of(ids[i]), "join", {"neighbors": [], "command": _argv(
                arm, model, batch, warmup, steps, nodes, outs[i])}, timeout=10)

        join(0)
        c.wait(lambda: active(ids[:1]), 120, f"{ids[0]} active")
        for i in range(1, nodes):
            join(i)
        say(f"{arm}: {nodes} members joining, then {warmup} + {steps} steps")
        return _collect(outs, lambda: not c.exited(), arm)


def rate(results: list[dict[str, Any]]) -> float:
    """Steps per second of an arm: its timed steps over its members' median seconds."""
    return results[0]["steps"] / statistics.median(r["seconds"] for r in results)


def run(model: str, nodes: int, batch: int, warmup: int, steps: int, repeats: int,
        arms: list[str], out: Path | None, keep: Path | None, say: Say,
        mbit: float | None = None, run_id: str | None = None,
        mbit_max: float | None = None, wire: str = "fp32") -> dict[str, Any]:
    """Every arm, ``repeats`` times in turn; the document that is written and reported.
    ``mbit``: on the netns testbed (a full mesh, every link shaped to it, or with
    ``mbit_max`` to a rate drawn between the two; ``run_id`` names its namespaces), else
    loopback. ``wire``: the Chaos arms' wire format (DDP's gloo sends fp32)."""
    bw = (mbit or 0.0, mbit_max or mbit or 0.0)
    doc: dict[str, Any] = {"bench": "throughput", "model": model, "nodes": nodes,
                           "batch": batch, "warmup": warmup, "steps": steps, "threads": 1,
                           "network": "loopback" if mbit is None else "netns", "mbit": mbit,
                           "mbit_max": bw[1] if mbit is not None else None,
                           "links_mbit": link_rates(nodes, bw) if mbit is not None else None,
                           "arms": arms, "wire": wire, "repeats": []}
    with tempfile.TemporaryDirectory(prefix="chaos-tput-") as tmp:
        for k in range(repeats):
            rep: dict[str, Any] = {}
            for arm in arms:
                work = Path(tmp) / f"r{k}"
                work.mkdir(exist_ok=True)
                say(f"repeat {k + 1}/{repeats}: {arm}")
                if mbit is not None:
                    results = (
                        run_ddp_netns(model, nodes, batch, warmup, steps, work, bw, run_id)
                        if arm == "ddp" else run_chaos_netns(
                            arm, model, nodes, batch, warmup, steps, work, bw, run_id, say,
                            wire))
                else:
                    results = (run_ddp(model, nodes, batch, warmup, steps, work)
                               if arm == "ddp" else
                               run_chaos(arm, model, nodes, batch, warmup, steps, work, say,
                                         wire))
                rep[arm] = {"steps_per_s": round(rate(results), 3), "workers": results}
                say(f"repeat {k + 1}/{repeats}: {arm} {rate(results):.2f} steps/s")
            doc["repeats"].append(rep)
        doc["parameters"] = doc["repeats"][0][arms[0]]["workers"][0]["parameters"]
        doc["summary"] = summary(doc)
        if keep is not None:
            keep_copy(Path(tmp), keep, say, "the workers' logs and results", "c-*", "tb-*")
    if out is not None:
        o = Output(out, say)
        o.json("throughput.json", doc)
        o.text("throughput.md", table(doc))
        o.figure("throughput.png", lambda plt: plot(plt, doc))
    return doc


def summary(doc: dict[str, Any]) -> dict[str, Any]:
    """Per arm: the median and range of its steps/s, and of its ratio to DDP (per repeat)."""
    res: dict[str, Any] = {}
    for arm in doc["arms"]:
        rates = [rep[arm]["steps_per_s"] for rep in doc["repeats"]]
        row: dict[str, Any] = {"steps_per_s": _spread(rates)}
        if arm != "ddp" and "ddp" in doc["arms"]:
            row["vs_ddp"] = _spread([rep[arm]["steps_per_s"] / rep["ddp"]["steps_per_s"]
                                     for rep in doc["repeats"]])
        res[arm] = row
    return res


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3)}


def table(doc: dict[str, Any]) -> str:
    """The markdown table of a run."""
    lo, hi = doc.get("mbit"), doc.get("mbit_max") or doc.get("mbit")
    where = ("loopback" if doc.get("network", "loopback") == "loopback" else
             f"a netns full mesh of {lo:g} Mbit/s links" if lo == hi else
             "a netns full mesh of links at " + ", ".join(
                 f"{k} {v:g}" for k, v in doc["links_mbit"].items()) + " Mbit/s")
    lines = [f"Throughput: {doc['model']} ({doc['parameters']:,} parameters), {doc['nodes']} "
             f"members on {where}, batch {doc['batch']} each, 1 thread each, "
             f"{doc['steps']} timed steps after {doc['warmup']}, {len(doc['repeats'])} repeats"
             + (f", Chaos on the {doc['wire']} wire" if doc.get("wire", "fp32") != "fp32" else ""),
             "", "| arm | steps/s median (min-max) | vs DDP median (min-max) |",
             "|---|---:|---:|"]
    for arm, row in doc["summary"].items():
        r = row["steps_per_s"]
        v = row.get("vs_ddp")
        vs = "1 (baseline)" if arm == "ddp" else (
            f"{v['median']:.3f}x ({v['min']:.3f}-{v['max']:.3f})" if v else "")
        lines.append(f"| {arm} | {r['median']:.2f} ({r['min']:.2f}-{r['max']:.2f}) | {vs} |")
    return "\n".join(lines)


def plot(plt: Any, doc: dict[str, Any]) -> Any:
    """Each arm's steps/s in every repeat."""
    fig, ax = plt.subplots(figsize=(6, 3.5))
    for i, arm in enumerate(doc["arms"]):
        rates = [rep[arm]["steps_per_s"] for rep in doc["repeats"]]
        ax.scatter([i] * len(rates), rates, label=arm)
    ax.set_xticks(range(len(doc["arms"])), doc["arms"])
    ax.set_ylabel("steps/s")
    ax.set_title(f"{doc['model']}, {doc['nodes']} members, batch {doc['batch']}")
    return fig
