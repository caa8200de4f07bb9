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
    from chaosctl import bench_control

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
