"""``chaosctl bench ...``: benchmarks that print tables and write JSON and plots."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from chaosctl.client import CtlUsageError
from chaosctl.common import console

bench_app = typer.Typer(
    name="bench",
    help="Benchmarks: tables on screen, JSON/markdown/PNG under --out.",
    no_args_is_help=True,
)


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
    """Scale-out delay and cluster idle time of the four strategies on the netns testbed."""
    from chaosctl.bench import scaleout as bench_scaleout
    from chaosctl.bench import scaleout_report as bench_scaleout_report
    from chaosctl.testbed.topo import PlanError, parse_bw

    try:
        rates = parse_bw(bw)
    except PlanError as exc:
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
