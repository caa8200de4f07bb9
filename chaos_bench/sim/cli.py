"""The ``chaosctl bench simulate`` command (registered in :mod:`chaos_bench.cli`).

Only typer and rich load with the CLI; SimPy, the planners and matplotlib load when it runs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from chaos_bench.output import Output, writable
from chaos_bench.progress import say
from chaos_bench.sim.errors import SimError
from chaosctl.client import CtlUsageError
from chaosctl.common import console

MAX_NODES = 100_000



def _nodes(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise CtlUsageError(f"--nodes must be comma-separated integers, not {text!r}") from None
    if not values or any(v < 3 or v > MAX_NODES for v in values):
        raise CtlUsageError(f"--nodes: each cluster size must be between 3 and {MAX_NODES:,}")
    return values


def simulate(
    nodes: Annotated[str, typer.Option(help="Cluster sizes N (N -> N+1), comma-separated.")]
    = "12,100,1000,10000",
    seed: Annotated[int, typer.Option(help="Seed of the topologies and timings.")] = 1,
    repeats: Annotated[int, typer.Option(min=1, max=50, help="Instances per size.")] = 4,
    models: Annotated[str, typer.Option(help="Models (paper_models.json), comma-separated.")]
    = "resnet101,alexnet,vgg11",
    testbed: Annotated[Path, typer.Option(help="`bench scaleout` results to validate against.")]
    = Path("bench/results/scaleout-testbed-stop3/scaleout.json"),  # validate.DEFAULT_TESTBED
    holdout: Annotated[Path | None, typer.Option(help="Fresh `bench scaleout` results "
                                                 "(other seeds, sizes, rates) to predict out "
                                                 "of sample: every constant fitted on "
                                                 "--testbed, only their configured rates "
                                                 "used.")] = None,
    validate: Annotated[bool, typer.Option(help="Replay the testbed first (and take the "
                                           "non-network costs from it).")] = True,
    measure_broker: Annotated[bool, typer.Option(help="Measure mosquitto's cost per delivery "
                                                 "on this box first (about 15 s).")] = False,
    broker_rate: Annotated[float | None, typer.Option(
        min=1.0, help="Heartbeat deliveries per second of one broker core (default: "
        "measured here, about 168,000).")] = None,
    out: Annotated[Path, typer.Option(help="Where results go.")] = Path("simulate"),
) -> None:
    """Discrete-event simulation to 10,000 nodes: scale-out delay and idle time against N,
    broker load and saturation, failover; validated against the netns testbed."""
    from chaos_bench.models import model_names
    from chaos_bench.sim import rate, report
    from chaos_bench.sim.run import Options, run

    sizes = _nodes(nodes)
    writable(out)
    names = tuple(m.strip() for m in models.split(",") if m.strip())
    bad = [m for m in names if m not in model_names()]
    if not names or bad:
        raise CtlUsageError(f"--models: {', '.join(bad) or 'nothing given'} is not one of "
                            f"{', '.join(model_names())}")
    if holdout is not None and not validate:
        raise CtlUsageError("--holdout is predicted from the --testbed fit: drop --no-validate")
    if measure_broker and broker_rate is not None:
        raise CtlUsageError("give --measure-broker or --broker-rate, not both")
    model = None
    if measure_broker:
        model = rate.measure(say)
    elif broker_rate is not None:
        model = rate.scaled(broker_rate)
    doc = run(Options(sizes, seed, repeats, names, testbed if validate else None, holdout,
                      model, measure_broker), say)
    try:
        report.write(Output(out, say), doc)
    except OSError as exc:
        raise SimError(f"cannot write the results under {out}: {exc.strerror or exc}") from None
    for table in report.tables(doc):
        console.print(table)
