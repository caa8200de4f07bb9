"""``chaosctl bench ...``: benchmarks that print tables and write JSON and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from chaosctl.client import CtlUsageError
from chaosctl.common import console

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks: tables on screen, JSON/markdown/PNG under --out.",
    no_args_is_help=True,
)


def _say(line: str) -> None:
    """Progress, dimmed, between the tables."""
    console.print(f"[dim]{escape(line)}[/]")


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
    from chaosctl.bench.models import model_entries, model_names

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
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("bench/results/control"),
) -> None:
    """Failure-detection latency (kill -9, SIGSTOP), scheduler failover, broker load."""
    from chaosctl.bench import control as bench_control

    if broker not in ("mosquitto", "embedded"):
        raise CtlUsageError(f"--broker must be mosquitto or embedded, not {broker!r}")
    rows = bench_control.run(_sizes(sizes), repeats, broker, load_seconds, out,
                             lambda line: console.print(f"[dim]{line}[/]"))
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
    seed: Annotated[int, typer.Option(help="Seed of the testbeds and states.")] = 1,
    out: Annotated[Path, typer.Option(help="Where results go.")]
    = Path("bench/results/scaleout-testbed"),
) -> None:
    """Scale-out delay and cluster idle time of the strategies on the netns testbed (chaos,
    chaos with the paper's planner, single, multi-source, stop-resume)."""
    from chaosctl.bench import scaleout as bench_scaleout
    from chaosctl.bench import scaleout_report as bench_scaleout_report
    from chaosctl.testbed.topo import TopologyError, parse_bw

    try:
        rates = parse_bw(bw)
    except TopologyError as exc:
        raise CtlUsageError(str(exc)) from None
    names = [m.strip() for m in models.split(",") if m.strip()]
    if not names:
        raise CtlUsageError("--models needs at least one model")
    doc = bench_scaleout.run(_sizes(sizes), names, repeats, rates, out,
                             lambda line: console.print(f"[dim]{line}[/]"), degree=degree,
                             iperf_s=iperf_seconds, checkpoints=checkpoints, seed=seed)
    table = Table(title="Scale-out on the netns testbed (medians; s, idle in node-s)")
    for col in bench_scaleout_report.COLUMNS:
        table.add_column(col, justify="left" if col == "model" else "right")
    for row in doc["rows"]:
        table.add_row(*bench_scaleout_report.cells(row))
    console.print(table)


@bench_app.command("allreduce")
def allreduce(
    mb: Annotated[int, typer.Option(min=1, max=4000, help="Gradient size, MB.")] = 100,
    nodes: Annotated[int, typer.Option(min=2, max=16, help="Processes in the chain.")] = 4,
    repeats: Annotated[int, typer.Option(min=1, max=100, help="Rounds after one warm-up.")] = 5,
    chunk_kb: Annotated[str, typer.Option(help="Chunk sizes, KiB, comma-separated.")]
    = "1024,4096",
    result: Annotated[str, typer.Option(help="fresh, reuse or both, comma-separated.")]
    = "fresh,reuse",
    sock_buf: Annotated[int, typer.Option(min=0, help="Socket buffers, bytes; 0 = autotuned.")]
    = 0,
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("bench/results/allreduce"),
) -> None:
    """All-reduce throughput on loopback against a plain socket copy of the same bytes."""
    from chaosctl.bench import allreduce as bench_allreduce

    chunks = _ints(chunk_kb, "--chunk-kb", 4, 1 << 20)
    modes = _choices(result, "--result", ["fresh", "reuse"])
    doc = bench_allreduce.run(mb, nodes, repeats, chunks, modes, sock_buf, out, _say)
    typer.echo(bench_allreduce.table(doc["rows"]))


@bench_app.command("planner")
def planner(
    quick: Annotated[bool, typer.Option(help="Fewer sizes, repeats and trials.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the neighbours and states.")] = 2024,
    models: Annotated[str, typer.Option(help="Paper models, comma-separated "
                                        "(default: all; with --quick, gpt2-large).")] = "",
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("bench/results/planner"),
) -> None:
    """Planner run time and makespan against water-filling: the default, the paper's
    Algorithms 1 and 2, and the baselines."""
    from chaosctl.bench import planner as bench_planner

    names = _models(models, synthetic=False) if models else None
    result = bench_planner.run(quick, seed, names, out, _say)
    typer.echo(bench_planner.tables(result))


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
    = Path("bench/results/scaleout-loopback"),
) -> None:
    """Scale-out delay of the four strategies on one loopback cluster with capped links."""
    from chaosctl.bench import loopback as bench_loopback
    from daemon.replication.planning.planner import PLANNERS

    if neighbors > nodes:
        raise CtlUsageError(f"--neighbors ({neighbors}) cannot exceed --nodes ({nodes})")
    _choices(planner, "--planner", list(PLANNERS))
    names = (_models(models, synthetic=True) if models
             else bench_loopback.QUICK if quick else bench_loopback.FULL)
    opts = bench_loopback.Options(repeats or (2 if quick else 3), nodes, neighbors, bw_scale,
                                  planner, seed)
    doc = bench_loopback.run(names, opts, out, _say)
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
        "0: membership changes only).")] = None,
) -> None:
    """The training-loop stall each primitive costs a chain of real workers (Table I)."""
    from chaosctl.bench import stall as bench_stall

    _, table = bench_stall.run(nodes, events, gap, out, keep, source, _say, digest_every)
    typer.echo(table)


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
    from chaosctl.bench import duty_cycle as bench_duty

    rows = bench_duty.run(_ints(rates, "--rates", 1, 10_000), gap, probes, json_out, _say)
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
    = Path("bench/results/convergence"),
    keep: Annotated[Path | None, typer.Option(help="Copy the workers' records and logs "
                                              "here.")] = None,
) -> None:
    """Loss and accuracy through scale-out and scale-in, with and without consistent mode
    (Figs. 11-14)."""
    import importlib.util

    from chaosctl.bench import convergence as bench_convergence
    from chaosctl.bench import convergence_report
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
    doc = bench_convergence.run(names, n, kinds, short, at, epochs, seed, out, keep, _say)
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
    out: Annotated[Path, typer.Option(help="Where soak.json and soak.png go.")]
    = Path("bench/results/soak"),
    keep: Annotated[Path | None, typer.Option(help="Copy the step records and logs here.")]
    = None,
) -> None:
    """A training cluster on the netns testbed under Poisson joins, leaves, kills, freezes,
    link cuts and broker restarts: growth per hour and every invariant violation."""
    from chaosctl.bench import soak as bench_soak
    from chaosctl.bench import soak_report
    from chaosctl.cluster import ClusterError
    from chaosctl.testbed.topo import TopologyError, parse_bw

    chosen = _choices(kinds, "--kinds", list(bench_soak.KINDS)) if kinds else bench_soak.KINDS
    try:
        rates = parse_bw(bw)
    except TopologyError as exc:
        raise CtlUsageError(str(exc)) from None
    if warmup is not None and warmup >= minutes * 60:
        raise CtlUsageError(f"--warmup ({warmup:g} s) must be shorter than the run "
                            f"({minutes * 60:g} s)")
    opts = bench_soak.Options(minutes, nodes, rate, sample_seconds, warmup, tuple(chosen),
                              rates, seed)
    doc = bench_soak.run(opts, out, _say, keep)
    console.print(soak_report.table(doc))
    console.print(soak_report.summary(doc))
    if doc["violations"]:
        raise ClusterError(f"{len(doc['violations'])} invariant violations, first: "
                           f"{doc['violations'][0]}")
