"""``chaosctl bench ...``: benchmarks that print tables and write JSON and plots."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from chaos_bench.output import writable
from chaos_bench.progress import say
from chaos_bench.sim.cli import simulate as sim_simulate
from chaosctl.client import CtlUsageError
from chaosctl.common import console

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks: tables on screen, JSON/markdown/PNG under --out (./BENCH by default).",
    no_args_is_help=True,
)


@bench_app.callback()
def _bench() -> None:
    unwind_once()


def unwind_once() -> None:
    """The first Ctrl-C or SIGTERM unwinds the bench (as KeyboardInterrupt), so the
    ``finally`` of whatever it started (clusters, namespaces, temp dirs) tears it down; any
    later one is ignored, so a second Ctrl-C, or the SIGTERM ``timeout`` or systemd sends
    beside it, cannot cut that teardown short. (SIGTERM's default, dying on the spot, left
    mosquitto, namespaces and temp dirs behind.)"""

    def on_signal(signum: int, frame: object) -> None:
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, signal.SIG_IGN)
        say(f"{signal.Signals(signum).name}: tearing down what the bench started "
            "(further interrupts are ignored)")
        raise KeyboardInterrupt

    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, on_signal)


def _ints(text: str, option: str, lo: int, hi: int) -> list[int]:
    """A comma-separated list of integers in ``[lo, hi]``."""
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CtlUsageError(f"{option} must be comma-separated integers, not {text!r}") from None
    if not values or any(v < lo or v > hi for v in values):
        raise CtlUsageError(f"{option}: each value must be between {lo} and {hi}")
    return values


def _choices(text: str, option: str, allowed: list[str]) -> list[str]:
    """A comma-separated list of names, each one of ``allowed``."""
    names = [x.strip() for x in text.split(",") if x.strip()]
    bad = [n for n in names if n not in allowed]
    if not names or bad:
        raise CtlUsageError(f"{option}: {', '.join(bad) or 'nothing given'} is not one of "
                            f"{', '.join(allowed)}")
    return names


def _models(text: str, synthetic: bool) -> list[str]:
    """Model names that exist (``synth-MIB`` too where the bench takes it)."""
    from chaos_bench.models import model_entries, model_names

    names = [x.strip() for x in text.split(",") if x.strip()]
    if not names:
        raise CtlUsageError("--models needs at least one model")
    for name in names:
        if not synthetic and name not in model_names():
            raise CtlUsageError(f"--models: unknown model {name!r}; choose from "
                                f"{', '.join(model_names())}")
        try:
            model_entries(name)
        except ValueError as exc:
            raise CtlUsageError(f"--models: {exc}") from None
    return names


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise CtlUsageError(f"--sizes must be comma-separated integers, not {text!r}") from None
    if not sizes or any(s < 3 or s > 64 for s in sizes):
        raise CtlUsageError("--sizes: each cluster size must be between 3 and 64")
    return sizes


@bench_app.command("control")
def control(
    sizes: Annotated[str, typer.Option(help="Cluster sizes, comma-separated.")] = "3,6,12",
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Repeats of each fault.")] = 5,
    broker: Annotated[str, typer.Option(help="mosquitto or embedded.")] = "mosquitto",
    load_seconds: Annotated[float, typer.Option(min=1.0, help="Broker-load window.")] = 10.0,
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("control"),
) -> None:
    """Failure-detection latency (kill -9, SIGSTOP), scheduler failover, broker load."""
    from chaos_bench.control import run as bench_control

    if broker not in ("mosquitto", "embedded"):
        raise CtlUsageError(f"--broker must be mosquitto or embedded, not {broker!r}")
    writable(out)
    rows = bench_control.run(_sizes(sizes), repeats, broker, load_seconds, out, say)
    table = Table(title="chaosd control plane (seconds from the signal)")
    for col in ("nodes", "metric", "n", "p50", "p95", "max"):
        table.add_column(col, justify="left" if col == "metric" else "right")
    for r in rows:
        table.add_row(str(r["nodes"]), r["metric"], str(r["n"]),
                      *(f"{r[k]:.3f}" for k in ("p50", "p95", "max")))
    console.print(table)


@bench_app.command("scaleout")
def scaleout(
    sizes: Annotated[str, typer.Option(help="Cluster sizes N (N -> N+1), comma-separated.")]
    = "6,7,8,9,10,11",
    models: Annotated[str, typer.Option(help="Models (paper_models.json) or synth-MIB.")]
    = "resnet101,alexnet,vgg11",
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Testbeds per size.")] = 2,
    bw: Annotated[str, typer.Option(help="Link bandwidth range, Mbit/s.")] = "100-1000",
    degree: Annotated[int, typer.Option(min=1, max=10, help="The new node's neighbours.")] = 3,
    iperf_seconds: Annotated[float, typer.Option(min=1.0, help="iperf3 test per link.")] = 2.0,
    checkpoints: Annotated[int, typer.Option(min=1, help="Stop-resume checkpoints written.")]
    = 1,
    stop_runs: Annotated[int, typer.Option(min=1, max=9, help="Stop-resume runs per "
                                           "instance; the median one is kept.")] = 1,
    seed: Annotated[int, typer.Option(help="Seed of the testbeds and states.")] = 1,
    star: Annotated[str, typer.Option(help="Instead of random testbeds, one star: the new "
                                      "node and one neighbour per rate, Mbit/s, e.g. "
                                      "200,400,800 (--sizes, --bw, --degree unused).")] = "",
    out: Annotated[Path, typer.Option(help="Where results go.")]
    = Path("scaleout"),
) -> None:
    """Scale-out delay and cluster idle time of the strategies on the netns testbed (chaos,
    chaos with the paper's planner, single, multi-source, stop-resume)."""
    from chaos_bench.scaleout import report as bench_scaleout_report
    from chaos_bench.scaleout import run as bench_scaleout
    from chaosctl.testbed.topo import TopologyError, parse_bw

    try:
        rates = parse_bw(bw)
    except TopologyError as exc:
        raise CtlUsageError(str(exc)) from None
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise CtlUsageError("--models needs at least one model")
    star_rates = _ints(star, "--star", 1, 100_000) if star else []
    writable(out)
    doc = bench_scaleout.run(_sizes(sizes), names, repeats, rates, out, say, degree=degree,
                             iperf_s=iperf_seconds, checkpoints=checkpoints, seed=seed,
                             star=[float(r) for r in star_rates], stop_runs=stop_runs)
    table = Table(title="Scale-out on the netns testbed (medians; s, idle in node-s)")
    for col in bench_scaleout_report.COLUMNS:
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in doc["rows"]:
        table.add_row(*bench_scaleout_report.cells(row))
    console.print(table)


@bench_app.command("allreduce")
def allreduce(
    network: Annotated[str, typer.Option(help="loopback, mesh or both, comma-separated.")]
    = "loopback,mesh",
    mb: Annotated[int, typer.Option(min=1, max=4000, help="Gradient size on loopback, MB.")]
    = 100,
    nodes: Annotated[int, typer.Option(min=2, max=16, help="Processes on loopback.")] = 4,
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Rounds of each after a warm-up.")]
    = 5,
    chunk_kb: Annotated[str, typer.Option(help="Chunk sizes, KiB, comma-separated; 0 sizes "
                                          "them by the vector (the Trainer's default).")]
    = "0,1024",
    result: Annotated[str, typer.Option(help="fresh, reuse or both, comma-separated.")]
    = "reuse",
    tree: Annotated[str, typer.Option(help="Loopback trees: chain (rooted at an end), centre "
                                      "(rooted at its centre), star; comma-separated.")]
    = "centre,star",
    wire: Annotated[str, typer.Option(help="Gradient wire formats of Chaos's rounds: fp32, "
                                      "fp16, bf16, int8; comma-separated.")] = "fp32",
    samples: Annotated[int, typer.Option(min=1, help="Samples per node (1: gloo's average).")]
    = 1,
    mesh_mb: Annotated[int, typer.Option(min=1, max=1000, help="Gradient size on the mesh, MB.")]
    = 20,
    mesh_chunk_kb: Annotated[int, typer.Option(min=0, max=1 << 14, help="Chunk size on the "
                                               "mesh, KiB; 0: sized by the vector.")] = 0,
    mesh_shape: Annotated[str, typer.Option(help="Mesh link rates: star (n1's links fast, "
                                            "the others slow), uniform (every link slow); "
                                            "comma-separated.")] = "star",
    fast_mbit: Annotated[float, typer.Option(min=1.0, help="Mesh: n1's links, Mbit/s.")] = 1000.0,
    slow_mbit: Annotated[float, typer.Option(min=1.0, help="Mesh: the other links, Mbit/s.")]
    = 100.0,
    sock_buf: Annotated[int, typer.Option(min=0, help="Socket buffers, bytes; 0 = autotuned.")]
    = 0,
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("allreduce"),
) -> None:
    """Chaos's all-reduce against torch.distributed gloo, in the same processes, on loopback
    and on a shaped netns full mesh: time, throughput, ratio, CPU seconds per GB."""
    from chaos_bench.allreduce import run as bench_allreduce
    from chaos_bench.allreduce.mesh import SHAPES
    from daemon.contracts.policy import WIRE_FORMATS

    opts = {"networks": _choices(network, "--network", ["loopback", "mesh"]), "mb": mb,
            "nodes": nodes, "repeats": repeats,
            "chunk_kbs": _ints(chunk_kb, "--chunk-kb", 0, 1 << 14),
            "results": _choices(result, "--result", ["fresh", "reuse"]),
            "trees": _choices(tree, "--tree", list(bench_allreduce.TREES)),
            "wires": _choices(wire, "--wire", list(WIRE_FORMATS)),
            "samples": samples, "mesh_mb": mesh_mb, "mesh_chunk_kb": mesh_chunk_kb,
            "mesh_shapes": _choices(mesh_shape, "--mesh-shape", list(SHAPES)),
            "fast_mbit": fast_mbit,
            "slow_mbit": slow_mbit, "sock_buf": sock_buf}
    writable(out)
    doc = bench_allreduce.run(opts, out, say)
    console.print(bench_allreduce.table(doc))


@bench_app.command("planner")
def planner(
    quick: Annotated[bool, typer.Option(help="Fewer sizes, repeats and trials.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the neighbours and states.")] = 2024,
    models: Annotated[str, typer.Option(help="Paper models, comma-separated "
                                        "(default: all; with --quick, gpt2-large).")] = "",
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("planner"),
) -> None:
    """Planner run time and makespan against water-filling: the default, the paper's
    Algorithms 1 and 2, and the baselines."""
    from chaos_bench.planner import run as bench_planner

    names = _models(models, synthetic=False) if models else None
    writable(out)
    result = bench_planner.run(quick, seed, names, out, say)
    typer.echo(bench_planner.tables(result))


@bench_app.command("signing")
def signing(
    quick: Annotated[bool, typer.Option(help="Fewer repeats; snapshots of 12 and 48 nodes.")]
    = False,
    nodes: Annotated[str, typer.Option(help="Cluster sizes of the snapshots and the heartbeat "
                                       "load, comma-separated (default 12,48,1000).")] = "",
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("signing"),
) -> None:
    """What signing the control plane costs: bytes and CPU per message, plain and signed."""
    from chaos_bench.signing import run as bench_signing

    sizes = _ints(nodes, "--nodes", 2, 5000) if nodes else None
    writable(out)
    doc = bench_signing.run(quick, sizes, out, say)
    typer.echo(bench_signing.table(doc))


@bench_app.command("snapshots")
def snapshots(
    quick: Annotated[bool, typer.Option(help="cnn only, few steps and repeats (seconds).")]
    = False,
    models: Annotated[str, typer.Option(help="cnn, mlp100m, comma-separated (default: both; "
                                        "with --quick, cnn).")] = "",
    out: Annotated[Path, typer.Option(help="Where results go (and, deleted afterwards, the "
                                      "snapshots timed: so on this folder's disk).")]
    = Path("snapshots"),
) -> None:
    """What durable snapshots cost: the step's path, the writer's thread, the disk per hour."""
    from chaos_bench.snapshots import run as bench_snapshots

    names = _choices(models, "--models", bench_snapshots.MODELS) if models else None
    writable(out)
    doc = bench_snapshots.run(quick, names, out, say)
    typer.echo(bench_snapshots.table(doc))


@bench_app.command("loopback")
def loopback(
    quick: Annotated[bool, typer.Option(help="ResNet101 and AlexNet, 2 repeats.")] = False,
    repeats: Annotated[int | None, typer.Option(min=1, max=20, help="Repeats per model "
                                                "(default 3, 2 with --quick).")] = None,
    models: Annotated[str, typer.Option(help="Models (paper_models.json) or synth-MIB, "
                                        "comma-separated.")] = "",
    nodes: Annotated[int, typer.Option(min=1, max=32, help="Cluster nodes before the join.")]
    = 6,
    neighbors: Annotated[int, typer.Option(min=1, max=32, help="The new node's neighbours.")]
    = 3,
    bw_scale: Annotated[float, typer.Option(min=0.001, help="Times the 100-1000 Mbit/s caps.")]
    = 1.0,
    planner: Annotated[str, typer.Option(help="Planner of the chaos strategy.")] = "chaos",
    seed: Annotated[int, typer.Option(help="Seed of the caps and states.")] = 1,
    out: Annotated[Path, typer.Option(help="Where results go.")]
    = Path("loopback"),
) -> None:
    """Scale-out delay of the four strategies on one loopback cluster with capped links."""
    from chaos_bench.scaleout import loopback as bench_loopback
    from chaos_edge.replication.planning.planner import PLANNERS

    if neighbors > nodes:
        raise CtlUsageError(f"--neighbors ({neighbors}) cannot exceed --nodes ({nodes})")
    _choices(planner, "--planner", list(PLANNERS))
    names = (_models(models, synthetic=True) if models
             else bench_loopback.QUICK if quick else bench_loopback.FULL)
    opts = bench_loopback.Options(repeats or (2 if quick else 3), nodes, neighbors, bw_scale,
                                  planner, seed)
    writable(out)
    doc = bench_loopback.run(names, opts, out, say)
    typer.echo(bench_loopback.caption(opts))
    typer.echo(bench_loopback.table(doc["rows"]))


@bench_app.command("stall")
def stall(
    nodes: Annotated[int, typer.Option(min=3, max=16, help="Chain length.")] = 4,
    events: Annotated[int, typer.Option(min=1, max=1000, help="Events of each kind.")] = 50,
    gap: Annotated[float, typer.Option(min=0.0, help="Seconds between link commands.")] = 0.3,
    out: Annotated[Path | None, typer.Option(help="Directory for stall.json, .md and .png.")]
    = None,
    keep: Annotated[Path | None, typer.Option(help="Copy the step records, events and logs "
                                              "here.")] = None,
    source: Annotated[Path | None, typer.Option("--from", help="Report on what a --keep run "
                                                "left in this directory; run nothing.")] = None,
    digest_every: Annotated[int | None, typer.Option(
        min=0, help="The divergence guard's period in steps (default: the Trainer's, 100; "
        "0: joins only).")] = None,
    model: Annotated[str, typer.Option(help="What the workers train: mlp (178 parameters), "
                                       "cnn, chartf or dense-25m (a 100 MB model).")] = "mlp",
) -> None:
    """The training-loop stall each primitive costs a chain of real workers (Table I)."""
    from chaos_bench.stall import MODELS
    from chaos_bench.stall import run as bench_stall

    if len(_choices(model, "--model", list(MODELS))) > 1:
        raise CtlUsageError(f"--model: one model a run, not {model!r}")
    writable(out)
    writable(keep, "--keep")
    _, table = bench_stall.run(nodes, events, gap, out, keep, source, say, digest_every, model)
    typer.echo(table)


@bench_app.command("throughput")
def throughput(
    model: Annotated[str, typer.Option(help="What every arm trains: cnn, chartf or dense-25m "
                                       "(25.1M parameters).")] = "cnn",
    nodes: Annotated[int, typer.Option(min=2, max=8, help="Members on this box.")] = 3,
    batch: Annotated[int, typer.Option(min=16, max=4096, help="Samples per member and step "
                                       "(a multiple of 16).")] = 64,
    warmup: Annotated[int, typer.Option(min=0, max=10_000, help="Untimed steps first.")] = 10,
    steps: Annotated[int, typer.Option(min=1, max=100_000, help="Timed steps.")] = 50,
    repeats: Annotated[int, typer.Option(min=1, max=20, help="Times every arm runs, in "
                                         "turn.")] = 3,
    arms: Annotated[str, typer.Option(help="ddp (torch DDP over gloo), chaos (the Trainer), "
                                      "chaos-overlap (the Trainer, overlap=True), chaos-ddp "
                                      "(chaos_edge.ddp); comma-separated.")]
    = "ddp,chaos,chaos-overlap,chaos-ddp",
    mbit: Annotated[float | None, typer.Option(min=1.0, max=100_000.0, help="Run on the netns "
                                               "testbed (root): a full mesh, every link "
                                               "shaped to this rate. Default: loopback.")]
    = None,
    mbit_max: Annotated[float | None, typer.Option(min=1.0, max=100_000.0, help="With --mbit: "
                                                   "each link shaped to its own rate, drawn "
                                                   "between --mbit and this (seed 1).")]
    = None,
    wire: Annotated[str, typer.Option(help="The Chaos arms' wire format: fp32, bf16, fp16 or "
                                      "int8 (DDP's gloo sends fp32).")] = "fp32",
    out: Annotated[Path | None, typer.Option(help="Directory for throughput.json, .md and "
                                             ".png.")] = None,
    keep: Annotated[Path | None, typer.Option(help="Copy the workers' results and logs "
                                              "here.")] = None,
) -> None:
    """Steps per second of the same training under torch DDP (gloo) and under Chaos, one
    arm after the other in every repeat."""
    from chaos_bench.throughput import ARMS, MODELS
    from chaos_bench.throughput import run as bench_throughput
    from daemon.contracts.policy import WIRE_FORMATS

    if len(_choices(model, "--model", list(MODELS))) > 1:
        raise CtlUsageError(f"--model: one model a run, not {model!r}")
    if batch % 16:
        raise CtlUsageError(f"--batch: {batch} is not a multiple of 16")
    names = _choices(arms, "--arms", list(ARMS))
    if mbit is not None:
        from netprobe import netns

        reason = netns.netns_unavailable_reason()
        if reason is not None:
            raise CtlUsageError(f"--mbit needs network namespaces: {reason}")
    if len(_choices(wire, "--wire", list(WIRE_FORMATS))) > 1:
        raise CtlUsageError(f"--wire: one format a run, not {wire!r}")
    if mbit_max is not None and (mbit is None or mbit_max < mbit):
        raise CtlUsageError("--mbit-max: give --mbit too, at most --mbit-max")
    writable(out)
    writable(keep, "--keep")
    doc = bench_throughput.run(model, nodes, batch, warmup, steps, repeats, names, out, keep,
                               say, mbit, mbit_max=mbit_max, wire=wire)
    typer.echo(bench_throughput.table(doc))


@bench_app.command("duty-cycle")
def duty_cycle(
    rates: Annotated[str, typer.Option(help="Link rates, Mbit/s, comma-separated.")]
    = "100,500,1000",
    gap: Annotated[float, typer.Option(min=0.0, help="Seconds between probes.")] = 0.5,
    probes: Annotated[int, typer.Option(min=1, max=100, help="Probes per rate.")] = 5,
    json_out: Annotated[Path | None, typer.Option("--json", help="Also write the rows here.")]
    = None,
) -> None:
    """What periodic bandwidth probing costs a tbf-shaped link (root, namespaces, iperf3)."""
    from chaos_bench.probes import duty_cycle as bench_duty

    writable(json_out, "--json", file=True)
    rows = bench_duty.run(_ints(rates, "--rates", 1, 10_000), gap, probes, json_out, say)
    typer.echo(bench_duty.table(rows))


@bench_app.command("convergence")
def convergence(
    models: Annotated[str, typer.Option(help="cnn, chartf, comma-separated (default: both; "
                                        "with --short, cnn).")] = "",
    nodes: Annotated[int | None, typer.Option(min=2, max=8, help="Starting nodes N: runs "
                                              "static N, N+1, N->N+1, N+1->N (default 4; "
                                              "with --short, 2).")] = None,
    at: Annotated[int | None, typer.Option(min=1, help="Epoch of the scale-out and the "
                                           "scale-in (default per model).")] = None,
    epochs: Annotated[int | None, typer.Option(min=2, max=1000, help="Epochs per run "
                                               "(default per model).")] = None,
    modes: Annotated[str, typer.Option(help="plain, consistent, comma-separated (default: "
                                       "both; with --short, consistent).")] = "",
    short: Annotated[bool, typer.Option(help="CI: tiny models, few steps, checks asserted.")]
    = False,
    seed: Annotated[int, typer.Option(help="Seed of the models and the data order.")] = 0,
    out: Annotated[Path, typer.Option(help="Where results go.")]
    = Path("convergence"),
    keep: Annotated[Path | None, typer.Option(help="Copy the workers' records and logs "
                                              "here.")] = None,
    wire: Annotated[str, typer.Option(help="Gradient wire formats ([training] wire): fp32, "
                                      "fp16, bf16, int8; comma-separated; each run in each, "
                                      "compared with fp32.")] = "fp32",
    static_only: Annotated[bool, typer.Option(help="Only the static runs (to compare wire "
                                              "formats).")] = False,
    repeats: Annotated[int | None, typer.Option(min=1, max=20, help="Runs of each static "
                                                "configuration, seeds SEED, SEED+1, ...: their "
                                                "band is the noise a change is held against "
                                                "(default 3; with --short, 1).")] = None,
) -> None:
    """Loss and accuracy through scale-out and scale-in, with and without consistent mode
    (Figs. 11-14), in each gradient wire format."""
    import importlib.util

    from chaos_bench.convergence import report as convergence_report
    from chaos_bench.convergence import run as bench_convergence
    from chaosctl.cluster import ClusterError

    names = _choices(models or ("cnn" if short else "cnn,chartf"), "--models",
                     list(bench_convergence.PLANS))
    kinds = _choices(modes or ("consistent" if short else "plain,consistent"), "--modes",
                     list(bench_convergence.MODES))
    n = nodes or (2 if short else 4)
    for name in names:
        plan = bench_convergence.plan_of(name, n, short, at, epochs)
        if plan.at >= plan.epochs:
            raise CtlUsageError(f"--at ({plan.at}) must be below the epochs of {name} "
                                f"({plan.epochs})")
    if "cnn" in names and importlib.util.find_spec("sklearn") is None:
        raise ClusterError("--models cnn needs scikit-learn: pip install "
                           "'chaos-edge[examples]'")
    from daemon.contracts.policy import WIRE_FORMATS

    wires = _choices(wire, "--wire", list(WIRE_FORMATS))
    writable(out)
    writable(keep, "--keep")
    doc = bench_convergence.run(names, n, kinds, short, at, epochs, seed, out, keep, say,
                                tuple(wires), static_only, repeats or (1 if short else 3))
    console.print(convergence_report.table(doc))
    bad = [f"{m} {k}: {p}" for m, md in doc["models"].items()
           for k, r in md["runs"].items() for p in r["problems"]]
    if bad:
        raise ClusterError(f"{len(bad)} checks failed, first: {bad[0]}")


@bench_app.command("soak")
def soak(
    minutes: Annotated[float, typer.Option(min=0.5, max=1440.0, help="Length of the chaos "
                                           "phase, once every node trains.")] = 10.0,
    nodes: Annotated[int, typer.Option(min=3, max=8, help="Testbed nodes (a full mesh).")] = 4,
    rate: Annotated[float, typer.Option(min=0.1, max=120.0, help="Chaos events per minute "
                                        "(Poisson).")] = 6.0,
    kinds: Annotated[str, typer.Option(help="Chaos kinds, comma-separated: join, leave, kill, "
                                       "freeze, cut, broker-restart (default: all).")] = "",
    sample_seconds: Annotated[float, typer.Option(min=1.0, max=600.0, help="Seconds between "
                                                  "samples of RSS, fds and threads.")] = 5.0,
    warmup: Annotated[float | None, typer.Option(min=0.0, help="Seconds left out of the growth "
                                                 "fits (default: a quarter of the run, at "
                                                 "most 120).")] = None,
    bw: Annotated[str, typer.Option(help="Link bandwidth range, Mbit/s.")] = "100-400",
    seed: Annotated[int, typer.Option(help="Seed of the testbed and the chaos.")] = 1,
    power_cut_every: Annotated[float, typer.Option(min=0.0, help="Seconds between power cuts "
                                                   "of every box at once (0: none).")] = 0.0,
    stall_limit: Annotated[float, typer.Option(min=1.0, help="Seconds without a committed "
                                               "step that count as a stall.")] = 60.0,
    out: Annotated[Path, typer.Option(help="Where soak.json and soak.png go.")]
    = Path("soak"),
    keep: Annotated[Path | None, typer.Option(help="Copy the step records and logs here.")]
    = None,
    recheck: Annotated[Path | None, typer.Option(help="Run nothing: check a kept run (its "
                                                 "soak.json and records/) again with today's "
                                                 "invariants, into its recheck.json.")]
    = None,
) -> None:
    """A training cluster on the netns testbed under Poisson joins, leaves, kills, freezes,
    link cuts and broker restarts, and power cuts of every box: growth per hour and every
    invariant violation (state loss, rollback, loss continuity, stalls)."""
    from chaos_bench.soak import report as soak_report
    from chaos_bench.soak import run as bench_soak
    from chaosctl.cluster import ClusterError
    from chaosctl.testbed.topo import TopologyError, parse_bw

    if recheck is not None:
        try:
            again = soak_report.recheck(recheck)
        except (OSError, ValueError, KeyError) as exc:
            raise CtlUsageError(f"cannot check {recheck} again: {exc}") from None
        for line in again["violations"]:
            say(f"violation: {line}")
        say(f"wrote {recheck / 'recheck.json'}")
        if again["violations"]:
            raise ClusterError(f"{len(again['violations'])} invariant violations, first: "
                               f"{again['violations'][0]}")
        return
    chosen = _choices(kinds, "--kinds", list(bench_soak.KINDS)) if kinds else bench_soak.KINDS
    try:
        rates = parse_bw(bw)
    except TopologyError as exc:
        raise CtlUsageError(str(exc)) from None
    if warmup is not None and warmup >= minutes * 60:
        raise CtlUsageError(f"--warmup ({warmup:g} s) must be shorter than the run "
                            f"({minutes * 60:g} s)")
    if power_cut_every and power_cut_every >= minutes * 60:
        raise CtlUsageError(f"--power-cut-every ({power_cut_every:g} s) must be shorter than "
                            f"the run ({minutes * 60:g} s)")
    opts = bench_soak.Options(minutes, nodes, rate, sample_seconds, warmup, tuple(chosen),
                              rates, seed, power_cut_every_s=power_cut_every,
                              limits=soak_report.Limits(stall_s=stall_limit))
    writable(out)
    writable(keep, "--keep")
    doc = bench_soak.run(opts, out, say, keep)
    console.print(soak_report.table(doc))
    console.print(soak_report.summary(doc))
    if doc["violations"]:
        raise ClusterError(f"{len(doc['violations'])} invariant violations, first: "
                           f"{doc['violations'][0]}")

# Defined in chaos_bench.sim.cli, which loads SimPy and the planners only when it runs.
bench_app.command("simulate")(sim_simulate)


def _floats(text: str, option: str, lo: float, hi: float) -> tuple[float, ...]:
    """A comma-separated list of numbers in ``[lo, hi]``."""
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CtlUsageError(f"{option} must be numbers separated by commas, not {text!r}"
                            ) from None
    if not values or any(not lo <= v <= hi for v in values):
        raise CtlUsageError(f"{option}: each value must be between {lo:g} and {hi:g}")
    return values


@bench_app.command("slowlinks")
def slowlinks(
    rates: Annotated[str, typer.Option(help="Link rates in Mbit/s, comma-separated.")]
    = "20,50,100",
    inner_steps: Annotated[str, typer.Option(help="DiLoCo's H values, comma-separated (each "
                                             "run beside every-step sync).")] = "20,50",
    steps: Annotated[int, typer.Option(min=10, max=100_000, help="Training steps per run (a "
                                       "multiple of every H).")] = 300,
    nodes: Annotated[int, typer.Option(min=2, max=8, help="Nodes in the testbed.")] = 3,
    seeds: Annotated[str, typer.Option(help="Seeds (initial weights, batch orders) of the "
                                       "reported runs, comma-separated.")] = "0,1,2",
    target_acc: Annotated[float, typer.Option(min=0.0, max=1.0, help="Test accuracy whose "
                                              "wall time is reported.")] = 0.95,
    outer_lr: Annotated[str, typer.Option(help="DiLoCo's outer learning rate; several, "
                                          "comma-separated: a grid chosen from on the "
                                          "validation split.")] = "0.3,0.5,0.7,1.0",
    outer_momentum: Annotated[str, typer.Option(help="Its Nesterov momentum; several: a "
                                                "grid, as --outer-lr.")] = "0,0.5,0.9",
    chunks: Annotated[str, typer.Option(help="Every-step's all-reduce chunk bytes (0: the "
                                        "Trainer's default); several: each timed first, "
                                        "the fastest used.")] = "0,32768,131072",
    wires: Annotated[str, typer.Option(help="Every-step's wire formats, one row each.")]
    = "fp32,int8",
    tune_steps: Annotated[int, typer.Option(min=10, max=10_000, help="Steps of each chunk "
                                            "trial.")] = 60,
    fragments: Annotated[str, typer.Option(help="Streaming DiLoCo's fragment counts, "
                                           "comma-separated; each runs at every H it "
                                           "divides (none: no streaming runs).")] = "",
    outer_wire: Annotated[str, typer.Option(help="The wire format of DiLoCo's and "
                                            "streaming's pseudo-gradients.")] = "fp32",
    overlap: Annotated[bool, typer.Option(help="Also run each streaming mode with its rounds "
                                          "beside the next step ([training] overlap).")]
    = False,
    task: Annotated[str, typer.Option(help="The model and data: digits (an MLP on "
                                      "scikit-learn's digits) or chartf (the character "
                                      "transformer on Python's help texts).")] = "digits",
    out: Annotated[Path, typer.Option(help="Where slowlinks.json and slowlinks.png go.")]
    = Path("slowlinks"),
) -> None:
    """Every-step sync (its fastest chunking, each wire format) against DiLoCo (its outer
    optimizer chosen on a validation split) and streaming DiLoCo on links shaped to each rate
    (netns testbed, root): wall time, time to a target accuracy, bytes per node, the largest
    round, test accuracy and loss."""
    import importlib.util

    from chaos_bench.slowlinks import report as slowlinks_report
    from chaos_bench.slowlinks import run as bench_slow
    from chaos_bench.slowlinks.task import TASKS
    from chaosctl.cluster import ClusterError
    from daemon.contracts.policy import WIRE_FORMATS

    mbps = _floats(rates, "--rates", 0.1, 10_000)
    hs = tuple(_ints(inner_steps, "--inner-steps", 2, 10_000))
    if any(steps % h for h in hs):
        raise CtlUsageError(f"--steps ({steps}) must be a multiple of every H in --inner-steps")
    formats = tuple(_choices(wires, "--wires", list(WIRE_FORMATS)))
    if formats[0] != "fp32":
        raise CtlUsageError("--wires must begin with fp32: the exact every-step run is the "
                            "baseline every ratio is against")
    parts = tuple(_ints(fragments, "--fragments", 2, 64)) if fragments.strip() else ()
    if parts and not any(h % p == 0 for h in hs for p in parts):
        raise CtlUsageError(f"--fragments: no value divides an H of --inner-steps ({inner_steps})")
    owire = outer_wire.strip()
    if owire not in WIRE_FORMATS:
        raise CtlUsageError(f"--outer-wire: {owire} is not one of {', '.join(WIRE_FORMATS)}")
    sizes = tuple(_ints(chunks, "--chunks", 0, 16 << 20))
    if any(c % 4 for c in sizes):
        raise CtlUsageError("--chunks: each size must be a multiple of 4 bytes (0: default)")
    if task not in TASKS:
        raise CtlUsageError(f"--task: {task} is not one of {', '.join(TASKS)}")
    opts = bench_slow.Options(
        mbps, hs, steps, nodes, target_acc=target_acc,
        outer_lrs=_floats(outer_lr, "--outer-lr", 0.0, 10.0),
        outer_momenta=_floats(outer_momentum, "--outer-momentum", 0.0, 0.999),
        seeds=tuple(_ints(seeds, "--seeds", 0, 99)),
        chunks=sizes, wires=formats,
        tune_steps=tune_steps, fragments=parts, outer_wire=owire, overlap=overlap, task=task)
    if task == "digits" and importlib.util.find_spec("sklearn") is None:
        raise ClusterError("the slow-links task needs scikit-learn: pip install "
                           "'chaos-edge[examples]'")
    writable(out)
    try:
        doc = bench_slow.run(opts, out, say)
    except (TimeoutError, OSError) as exc:
        raise ClusterError(f"the slow-links bench failed: {exc}") from None
    typer.echo(slowlinks_report.table(doc))


@bench_app.command("adaptive")
def adaptive(
    policies: Annotated[str, typer.Option(help="The policies to run, comma-separated: "
                                          "adaptive (the controller) and fixed ones.")]
    = "adaptive,every-step,every-step int8,diloco,streaming",
    phases: Annotated[str, typer.Option(help="The links' schedule, comma-separated phases "
                                        "RATExSECONDS, RATE/EDGExSECONDS (EDGE: the last "
                                        "node's links) or RATE+MSxSECONDS (MS: its extra "
                                        "compute per step), or both.")]
    = "1000x20,20x20,200/5x20,1000+150x20",
    seeds: Annotated[str, typer.Option(help="Seeds (initial weights, batch orders), "
                                       "comma-separated.")] = "0,1,2",
    nodes: Annotated[int, typer.Option(min=2, max=8, help="Nodes in the testbed.")] = 3,
    inner_steps: Annotated[int, typer.Option(min=2, max=1000, help="H of the fixed DiLoCo "
                                             "and streaming runs.")] = 20,
    fragments: Annotated[int, typer.Option(min=2, max=64, help="Streaming's fragments (must "
                                           "divide --inner-steps).")] = 5,
    target_loss: Annotated[float | None, typer.Option(min=0.01, max=10.0, help="Validation "
                                                      "loss whose wall time is reported "
                                                      "(a run: 2.4).")] = None,
    probe_s: Annotated[float, typer.Option(min=1.0, max=3600.0, help="Background bandwidth "
                                           "probe period, in every run.")] = 5.0,
    out: Annotated[Path, typer.Option(help="Where adaptive.json, .md and .png go.")]
    = Path("adaptive"),
    from_: Annotated[Path | None, typer.Option("--from", help="Run nothing: the report again "
                                               "from the runs in this adaptive.json (with "
                                               "--target-loss if given).")] = None,
) -> None:
    """The policy controller against each fixed policy while the links change on a schedule
    and one box slows down (netns testbed, root): time to a target validation loss, final
    validation loss, step rate per phase, and every switch with its predicted and measured
    step time."""
    import importlib.util

    from chaos_bench.adaptive import report as adaptive_report
    from chaos_bench.adaptive import run as bench_adaptive
    from chaosctl.cluster import ClusterError

    names = tuple(_choices(policies, "--policies", list(bench_adaptive.POLICIES)))
    try:
        schedule = bench_adaptive.parse_phases(phases)
    except ValueError as exc:
        raise CtlUsageError(str(exc)) from None
    if inner_steps % fragments:
        raise CtlUsageError(f"--fragments ({fragments}) must divide --inner-steps "
                            f"({inner_steps})")
    opts = bench_adaptive.Options(
        names, schedule, tuple(_ints(seeds, "--seeds", 0, 99)), nodes,
        inner_steps=inner_steps, fragments=fragments, probe_s=probe_s,
        target_loss=bench_adaptive.Options.target_loss if target_loss is None else target_loss)
    if from_ is not None:
        writable(out)
        try:
            doc = bench_adaptive.reanalyse(from_, out, say, target_loss)
        except ValueError as exc:
            raise CtlUsageError(str(exc)) from None
        typer.echo(adaptive_report.table(doc))
        return
    if importlib.util.find_spec("pydoc_data") is None:
        raise ClusterError("the adaptive bench's text (pydoc_data) is missing from this Python")
    writable(out)
    try:
        doc = bench_adaptive.run(opts, out, say)
    except (TimeoutError, OSError) as exc:
        raise ClusterError(f"the adaptive bench failed: {exc}") from None
    typer.echo(adaptive_report.table(doc))


@bench_app.command("dst")
def dst(
    seeds: Annotated[int, typer.Option(min=1, max=10_000_000, help="How many seeds to run.")]
    = 1000,
    start: Annotated[int, typer.Option(min=0, help="The first seed.")] = 0,
    duration: Annotated[float, typer.Option(min=10.0, max=3600.0, help="Simulated seconds "
                                            "of each run.")] = 60.0,
    jobs: Annotated[int, typer.Option(min=0, max=256, help="Processes (0: one per core).")]
    = 0,
    seed: Annotated[int | None, typer.Option(min=0, help="Run only this seed, twice (it must "
                                             "replay exactly), and print its trace.")] = None,
    shrink: Annotated[bool, typer.Option(help="With --seed: shrink a failing plan to the "
                                         "faults that matter.")] = False,
    out: Annotated[Path, typer.Option(help="Where dst.json, dst.md and failing seeds' traces "
                                      "go.")] = Path("dst"),
    mutant: Annotated[str | None, typer.Option(help="Put back one fault the project once had "
                                               "(see --list-mutants), to show it is caught.")]
    = None,
    list_mutants: Annotated[bool, typer.Option(help="List the mutants and exit.")] = False,
    policy_ops: Annotated[bool, typer.Option(help="Draw operator policy ops (chaosctl policy "
                                             "set) into 30% of the plans; --no-policy-ops: "
                                             "each seed's plan as drawn before them.")] = True,
    slow: Annotated[bool, typer.Option(help="Draw slow boxes (and run the straggler judge) "
                                       "into 30% of the plans; --no-slow: each seed's plan "
                                       "as drawn before them.")] = True,
    slow_links: Annotated[bool, typer.Option(help="Draw a box on slow links (and run the "
                                             "straggler judge) into 20% of the plans; "
                                             "--no-slow-links: each seed's plan as drawn "
                                             "before them.")] = True,
) -> None:
    """Deterministic simulation of the control plane: the real agents, scheduler and the
    worker's join and serve machines on a simulated broker, clock and network, faults drawn
    from each seed, every invariant checked after every event. Exits 1 on a violation."""
    from chaos_bench.dst import campaign
    from chaos_bench.dst.faults import Draws
    from chaos_bench.dst.loop import HarnessError
    from chaos_bench.dst.mutants import MUTANTS
    from chaosctl.cluster import ClusterError

    if list_mutants:
        for m in MUTANTS.values():
            typer.echo(f"{m.name:<20} {m.what} (fixed in {m.fixed_in})")
        return
    if shrink and seed is None:
        raise CtlUsageError("--shrink needs --seed")
    if mutant is not None and mutant not in MUTANTS:
        raise CtlUsageError(f"no mutant {mutant!r}; one of: {', '.join(MUTANTS)}")
    if seed is None:
        writable(out)
    draws = Draws(policy_ops=policy_ops, slow=slow, slow_links=slow_links)
    try:
        if seed is not None:
            res = campaign.one(seed, duration, shrink, say, mutant, draws)
            if not res.ok:
                raise typer.Exit(1)
            return
        doc = campaign.campaign(seeds, start, duration, jobs or campaign.default_jobs(), out,
                                say, mutant, draws)
    except HarnessError as exc:
        raise ClusterError(f"the simulator itself failed: {exc}") from None
    except OSError as exc:
        raise ClusterError(f"cannot write the results to {out}: {exc}") from None
    typer.echo(campaign.table(doc))
    if doc["violations_by_kind"] or doc["crashes"] or doc["harness_errors"]:
        raise typer.Exit(1)
    if doc["interrupted"]:
        raise typer.Exit(130)


@bench_app.command("check")
def check(
    only: Annotated[str, typer.Option(help="Guards, comma-separated: planner, simulate "
                                      "(deterministic: CI runs these), allreduce (timing, "
                                      "about a minute), mesh (timing, as root, about two "
                                      "minutes), scaleout (timing, as root, about two "
                                      "minutes), stall (timing, about 90 s), slowlinks "
                                      "(no network, about 20 s), convergence (training, "
                                      "about 90 s), throughput (timing, as root, about two "
                                      "minutes).")]
    = "planner,simulate,allreduce,mesh,scaleout,stall,slowlinks,convergence",
    results: Annotated[Path, typer.Option(help="The committed results: a checkout's "
                                          "bench/results.")] = Path("bench/results"),
    tolerance: Annotated[float, typer.Option(min=0.0, max=0.9, help="How much worse a timing "
                                             "ratio may be than committed (0.15: 15%).")]
    = 0.15,
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("check"),
) -> None:
    """Rerun the quick version of each headline bench and compare it with the committed
    results: exit 1 when a figure regressed."""
    from chaos_bench.check import run as bench_check

    names = _choices(only, "--only", list(bench_check.GUARDS))
    writable(out)
    doc = bench_check.run(names, results, tolerance, out, say)
    console.print(bench_check.table(doc))
    if doc["regressed"]:
        typer.echo(f"regressed: {'; '.join(doc['regressed'])}", err=True)
        raise typer.Exit(1)
